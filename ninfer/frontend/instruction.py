"""The leading instruction that states a requested response format in the prompt.

The matcher enforces the format; the instruction only tells the model what the grammar will hold it to, which
matters most when a tool call remains an alternative. The caller's messages are kept verbatim: the instruction
leads the existing system message, or becomes a new system message, in which case every caller message index
(and so every explicit cache boundary) moves by one.
"""

from __future__ import annotations

import json
from typing import Sequence

from .grammar.options import StructuredOutputOptions


def format_instruction(options: StructuredOutputOptions) -> str | None:
    fmt = options.response_format
    if not fmt.is_json:
        return None
    when = "When you answer without calling a tool, your" if options.tools_active else "Your"
    if fmt.kind == "json_object":
        return f"{when} final answer must be a single JSON object and nothing else."
    schema = json.dumps(fmt.final_schema(), ensure_ascii=False)
    named = f" ({fmt.name})" if fmt.name else ""
    return f"{when} final answer must be a single JSON value conforming to this JSON schema{named}, and nothing " \
           f"else:\n{schema}"


def with_instruction(messages: Sequence[dict], instruction: str | None) -> tuple[tuple[dict, ...], int]:
    """(messages with the instruction leading, how far caller message indices moved)."""
    if instruction is None:
        return tuple(messages), 0
    if messages and messages[0]["role"] == "system":
        lead = {**messages[0], "content": instruction + "\n\n" + messages[0]["content"]}
        return (lead, *messages[1:]), 0
    return ({"role": "system", "content": instruction}, *messages), 1
