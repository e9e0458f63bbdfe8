"""The thinking budget of a request: how many reasoning tokens come before the forced `</think>`.

With thinking on and a forced tool call (`tool_choice` `required` or a named tool), the grammar admits the call
only after `</think>`; reasoning that ran to `max_tokens` would leave no call at all. So the budget is capped
where the forced suffix and the widest of the callable tools' shortest calls still fit: the call's tags and
required parameter names as the template spells them, plus VALUE_TOKENS for each required value. The caller's
own budget (a request's `thinking_token_budget`, a server default) applies when it is smaller.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .grammar.options import StructuredOutputOptions
from .messages import ToolSpec
from .render import tool_calls_text
from .tokenizer import Qwen35Tokenizer

VALUE_TOKENS = 16  # room for one argument value of a forced call beyond its tags


def call_room(tools: Sequence[ToolSpec], tokenizer: Qwen35Tokenizer) -> int:
    """Output tokens that the shortest call of the widest tool takes, VALUE_TOKENS per required value included."""
    room = 0
    for tool in tools:
        params = tool.parameters if isinstance(tool.parameters, Mapping) else {}
        required = [k for k in params.get("required", ()) if isinstance(k, str)]
        skeleton = tool_calls_text([{"name": tool.name, "arguments": dict.fromkeys(required, "")}], "")
        room = max(room, len(tokenizer.encode(skeleton)) + VALUE_TOKENS * len(required))
    return room


def thinking_budget(requested: int | None, structured: StructuredOutputOptions | None, *, reasoning_open: bool,
                    max_tokens: int, suffix_tokens: int, tokenizer: Qwen35Tokenizer) -> int | None:
    """The budget the session enforces: the caller's, capped so that a forced call fits in max_tokens."""
    if structured is None or not structured.calls_forced or not reasoning_open:
        return requested
    cap = max(0, max_tokens - suffix_tokens - call_room(structured.callable_tools, tokenizer))
    return cap if requested is None else min(requested, cap)
