"""The prefix-execution boundary of a model output: whether the next request's history rendering reproduces the
tokens the model ran, exactly.

A chat prompt ends with the generation prompt (`<|im_start|>assistant\\n`, then `<think>\\n` or the empty think block
of a non-thinking request). When the conversation continues without a new user query (a tool result, the agent
loop), the renderer writes this assistant turn back with its reasoning kept: `assistant_text(message, True)`.
If the tokens of that text (without the newline after `<|im_end|>`) equal the generation prompt's tokens plus the
output's, a checkpoint of the output is a prefix of the next prompt and worth retaining; otherwise (reasoning the
renderer drops, text it strips, a tokenization the model produced differently) the output has no boundary and
reuse falls back to the prompt's turn boundaries. `<|im_start|>` is a special token, so the assistant turn
tokenizes the same alone as inside the whole conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Sequence

from .render import assistant_text
from .tool_calls import ToolCall

ASSISTANT_HEADER = "<|im_start|>assistant\n"


@dataclass(frozen=True)
class HistoryCheck:
    head: tuple[int, ...]  # the prompt's tokens from the generation prompt's <|im_start|> on
    encode: Callable[[str], Sequence[int]]

    def reproduces(self, output: Sequence[int], content: str, reasoning: str, calls: Sequence[ToolCall]) -> bool:
        """The rendered assistant turn tokenizes to exactly the generation prompt plus `output` (which ends with
        <|im_end|>)."""
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning,
                   "tool_calls": [{"type": "function", "function": {"name": c.name,
                                                                    "arguments": json.loads(c.arguments)}}
                                  for c in calls]}
        text = assistant_text(message, keep_reasoning=True)
        return tuple(self.encode(text[:-1])) == self.head + tuple(output)


def history_check(prompt_ids: Sequence[int], im_start: int,
                  encode: Callable[[str], Sequence[int]]) -> HistoryCheck | None:
    """The check for a prompt that ends with a generation prompt (None when it has no <|im_start|>)."""
    ids = tuple(prompt_ids)
    at = next((i for i in range(len(ids) - 1, -1, -1) if ids[i] == im_start), None)
    return None if at is None else HistoryCheck(ids[at:], encode)
