"""The built-in Python renderer of the Qwen3.5 chat format, for checkpoints that carry no Jinja template.

It reproduces the official template (ninfer/frontend/templates/qwen3_5.jinja) byte for byte on normalized
input (see messages.py); tests hold the two, and transformers' apply_chat_template, to the same text. Besides
the text it reports where each message's rendering ends, the cache boundaries a PreparedPrompt digests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .messages import is_tool_response

TOOLS_HEADER = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
TOOLS_FOOTER = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in "
    "natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer "
    "the question like normal with your current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>")


@dataclass(frozen=True)
class RenderedChat:
    """Prompt text plus character offsets: `header_end` after the system/tools turn (0 if none) and
    `message_ends[i]` just after message i's rendering (merged tool results end inside the user turn)."""

    text: str
    header_end: int
    message_ends: tuple[int, ...]
    reasoning_open: bool  # the generation prompt leaves a <think> block open
    builtin: bool = True  # rendered by this module (False: message ends found in a foreign template's text)


def tojson(value: Any) -> str:
    """transformers' `tojson`: no HTML escaping, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False)


def parameter_text(value: Any) -> str:
    """A tool argument as the template writes it: JSON for objects and arrays, Jinja's `string` otherwise
    (so True renders as 'True' and None as 'None', exactly as the template does)."""
    if isinstance(value, (Mapping, list, tuple)):
        return tojson(value)
    return str(value)


def _header(messages: Sequence[dict], tools: Sequence[dict]) -> str:
    system = messages[0]["content"].strip() if messages[0]["role"] == "system" else None
    if tools:
        body = TOOLS_HEADER + "".join("\n" + tojson(t) for t in tools) + TOOLS_FOOTER
        if system:
            body += "\n\n" + system
        return "<|im_start|>system\n" + body + "<|im_end|>\n"
    if system is not None:
        return "<|im_start|>system\n" + system + "<|im_end|>\n"
    return ""


def last_query_index(messages: Sequence[dict]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m["role"] == "user" and not is_tool_response(m["content"]):
            return i
    raise ValueError("No user query found in messages.")


def split_reasoning(message: Mapping) -> tuple[str, str]:
    """(reasoning, content) of an assistant message, as the template derives them."""
    content = message["content"].strip()
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning = ""
        if "</think>" in content:
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
    return reasoning.strip(), content


def tool_calls_text(calls: Sequence[Mapping], content: str) -> str:
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function", call)
        lead = ("\n\n" if content.strip() else "") if j == 0 else "\n"
        out.append(f"{lead}<tool_call>\n<function={fn['name']}>\n")
        for name, value in fn.get("arguments", {}).items():
            out.append(f"<parameter={name}>\n{parameter_text(value)}\n</parameter>\n")
        out.append("</function>\n</tool_call>")
    return "".join(out)


def assistant_text(message: Mapping, keep_reasoning: bool) -> str:
    reasoning, content = split_reasoning(message)
    if keep_reasoning:
        text = "<|im_start|>assistant\n<think>\n" + reasoning + "\n</think>\n\n" + content
    else:
        text = "<|im_start|>assistant\n" + content
    return text + tool_calls_text(message.get("tool_calls") or (), content) + "<|im_end|>\n"


def generation_prompt(enable_thinking: Any) -> str:
    # The template tests `enable_thinking is false`: only the boolean False turns thinking off.
    return "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if enable_thinking is False else "<think>\n")


def render_qwen35(messages: Sequence[dict], tools: Sequence[dict] = (), *, add_generation_prompt: bool = True,
                  enable_thinking: Any = True) -> RenderedChat:
    """Render normalized messages (messages.normalize_chat) in the Qwen3.5 chat format."""
    parts = [_header(messages, tools)]
    size = len(parts[0])
    header_end = size
    last_query = last_query_index(messages)
    ends = []
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "user":
            piece = "<|im_start|>user\n" + m["content"].strip() + "<|im_end|>\n"
        elif role == "assistant":
            piece = assistant_text(m, keep_reasoning=i > last_query)
        elif role == "tool":
            opens = messages[i - 1]["role"] != "tool"
            closes = i + 1 == len(messages) or messages[i + 1]["role"] != "tool"
            piece = (("<|im_start|>user" if opens else "") + "\n<tool_response>\n" + m["content"].strip()
                     + "\n</tool_response>" + ("<|im_end|>\n" if closes else ""))
        else:
            piece = ""  # the system message lives in the header
        parts.append(piece)
        size += len(piece)
        ends.append(size)
    if add_generation_prompt:
        parts.append(generation_prompt(enable_thinking))
    return RenderedChat("".join(parts), header_end, tuple(ends),
                        add_generation_prompt and enable_thinking is not False)
