"""Normalize an OpenAI-shaped chat request into the plain data both chat renderers consume.

Everything the Qwen3.5 format cannot represent is refused here, before rendering, with
`RequestRejected(UNREPRESENTABLE)` naming the offending message or field. After normalization a message is a
plain dict with `role` in {system, user, assistant, tool} and string `content` (an image part of a user message,
already acquired by the Gateway as `ImageData`, becomes the template's `<|vision_start|><|image_pad|><|vision_end|>`
text, with "Picture N: " before it under `add_vision_id`, and its data goes to the caller's image list); an assistant message may carry
`reasoning_content` (str) and `tool_calls` ([{"type": "function", "function": {"name", "arguments": dict}}]).
Both renderers then agree byte for byte, and the Jinja template never meets a shape it would render oddly
(a leading tool result, string-valued tool arguments, image parts).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ninfer.contracts import RejectReason, RequestRejected

from .input_bounds import check_depth, check_text, loads_bounded

TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
ROLES = ("system", "developer", "user", "assistant", "tool")


def reject(message: str) -> RequestRejected:
    return RequestRejected(RejectReason.UNREPRESENTABLE, message)


@dataclass(frozen=True)
class ToolSpec:
    """One declared function tool: its name and the JSON schema of its arguments (None: untyped)."""

    name: str
    parameters: Mapping[str, Any] | None
    strict: bool = False
    declaration: Mapping[str, Any] = field(default_factory=dict, compare=False)  # as the caller sent it


@dataclass(frozen=True)
class ChatInput:
    """A normalized conversation: plain messages, the tools as declared and as parsed specs."""

    messages: tuple[dict, ...]
    tools: tuple[dict, ...] = ()
    specs: tuple[ToolSpec, ...] = ()


VISION_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"  # what the chat template renders for an image part
TEXT_ONLY = "this Frontend renders text only"


@dataclass
class ImageSink:
    """Where normalization puts a conversation's images (in prompt order); `refusal` says why images are refused
    (None: accepted)."""

    refusal: str | None = TEXT_ONLY
    add_vision_id: bool = False
    images: list = field(default_factory=list)


def _image_part(part: Mapping, where: str, role: str, sink: ImageSink) -> str:
    from .media import ImageData

    if sink.refusal is not None:
        raise reject(f"{where} is an image part; {sink.refusal}")
    if role != "user":
        raise reject(f"{where}: only user messages may carry images (the {role} message has one)")
    data = part.get("image")
    if not isinstance(data, ImageData):
        raise reject(f"{where}: the image was not acquired (the Gateway turns image_url parts into image data)")
    sink.images.append(data)
    return (f"Picture {len(sink.images)}: " if sink.add_vision_id else "") + VISION_TEXT


def _text_of(content: Any, where: str, role: str = "user", sink: ImageSink | None = None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    sink = sink or ImageSink()
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise reject(f"{where}.content[{j}] must be an object, got {type(part).__name__}")
            kind = part.get("type", "text")
            if kind in ("image", "image_url") or "image_url" in part:
                parts.append(_image_part(part, f"{where}.content[{j}]", role, sink))
                continue
            if kind in ("video", "video_url", "input_audio"):
                raise reject(f"{where}.content[{j}] is a {kind} part; ninfer takes text and images only")
            if kind != "text" or not isinstance(part.get("text"), str):
                raise reject(f"{where}.content[{j}] must be a text part with a string 'text', got type {kind!r}")
            parts.append(part["text"])
        return "".join(parts)  # the template concatenates text items without separators
    raise reject(f"{where}.content must be a string, a list of text parts or null, got {type(content).__name__}")


def _arguments(raw: Any, where: str) -> dict:
    if isinstance(raw, str):
        raw = loads_bounded(raw, f"{where}.arguments") if raw.strip() else {}
    check_depth(raw, f"{where}.arguments")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise reject(f"{where}.arguments must be a JSON object, got {type(raw).__name__}")
    return dict(raw)


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise reject(f"{where}.tool_calls must be a list")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, Mapping):
            raise reject(f"{at} must be an object")
        fn = call.get("function", call)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not TOOL_NAME.fullmatch(fn["name"]):
            raise reject(f"{at}.function.name must match {TOOL_NAME.pattern}")
        out.append({"type": "function", "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments"), at)}})
    return out


def _message(i: int, m: Any, previous: dict | None, sink: ImageSink | None = None) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, Mapping):
        raise reject(f"{where} must be an object, got {type(m).__name__}")
    role = m.get("role")
    if role not in ROLES:
        raise reject(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
    role = "system" if role == "developer" else role
    if role == "system" and i != 0:
        raise reject(f"{where}: a system message must be the first message")
    out: dict = {"role": role, "content": _text_of(m.get("content"), where, role, sink)}
    check_text(out["content"], f"{where}.content")
    if role == "assistant":
        reasoning = m.get("reasoning_content", m.get("reasoning"))
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise reject(f"{where}.reasoning_content must be a string")
            check_text(reasoning, f"{where}.reasoning_content")
            out["reasoning_content"] = reasoning
        if m.get("tool_calls"):
            out["tool_calls"] = _tool_calls(m["tool_calls"], where)
    elif m.get("tool_calls"):
        raise reject(f"{where}: only assistant messages carry tool_calls")
    if role == "tool" and (previous is None or previous["role"] not in ("assistant", "tool")):
        raise reject(f"{where}: a tool result must follow the assistant turn that called the tool")
    return out


def _tool(i: int, t: Any) -> tuple[dict, ToolSpec]:
    where = f"tools[{i}]"
    if not isinstance(t, Mapping) or t.get("type", "function") != "function" or not isinstance(t.get("function"), Mapping):
        raise reject(f"{where} must be {{'type': 'function', 'function': {{...}}}}")
    fn = t["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise reject(f"{where}.function.name must match {TOOL_NAME.pattern}, got {name!r}")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, Mapping):
        raise reject(f"{where}.function.parameters must be a JSON schema object")
    check_depth(t, where)
    try:
        declared = json.loads(json.dumps(t, ensure_ascii=False))  # a plain, order-preserving JSON copy
    except (TypeError, ValueError) as e:
        raise reject(f"{where} is not JSON-serializable: {e}") from e
    return declared, ToolSpec(name, declared["function"].get("parameters"), bool(fn.get("strict", False)), declared)


def normalize_chat(messages: Any, tools: Any = None, images: ImageSink | None = None) -> ChatInput:
    """Validate and normalize `messages` (and `tools`); raises RequestRejected(UNREPRESENTABLE). Image parts go to
    `images` (refused without one)."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise reject("messages must be a non-empty list")
    out: list[dict] = []
    for i, m in enumerate(messages):
        out.append(_message(i, m, out[-1] if out else None, images))
    if not any(m["role"] == "user" and not is_tool_response(m["content"]) for m in out):
        raise reject("messages contain no user query (only system, assistant or tool turns)")
    declared, specs = [], []
    for i, t in enumerate(tools or ()):
        d, s = _tool(i, t)
        if any(p.name == s.name for p in specs):
            raise reject(f"tools[{i}]: tool name {s.name!r} is declared twice")
        declared.append(d)
        specs.append(s)
    return ChatInput(tuple(out), tuple(declared), tuple(specs))


def is_tool_response(content: str) -> bool:
    """A user turn that only carries tool results is not a query (the template's last-query rule)."""
    c = content.strip()
    return c.startswith("<tool_response>") and c.endswith("</tool_response>")
