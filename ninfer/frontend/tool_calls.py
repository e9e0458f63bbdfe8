"""Qwen XML tool calls: parse one `<tool_call>` body into an OpenAI tool call, typed by the tool's schema.

    <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>\n</tool_call>

VALUE is raw text; the tool's JSON schema decides its type (integer, number, boolean, null, object, array);
strings and values that do not parse as their declared type stay raw strings. An enum or const member is
matched by the text the template renders for it, so `c` is "c" while a model's stray `c\n` falls back to the
stripped text. Booleans accept the template's `True`/`False` and JSON's `true`/`false`. Arguments are serialized as
one JSON string; `argument_fragments` splits that string at parameter boundaries for streaming, and the
fragments concatenate to exactly the final `arguments`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .messages import ToolSpec
from .render import parameter_text

FUNCTION = re.compile(r"\s*<function=([^>\n]+)>\n?(.*?)\n?</function>\s*", re.S)
PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, serialized
    fragments: tuple[str, ...] = field(default=(), compare=False, repr=False)  # `arguments`, split for streaming

    def deltas(self, index: int) -> list["ToolCallDelta"]:
        """The streaming fragments of this call: id and name first, then the arguments piece by piece."""
        return [ToolCallDelta(index, "", self.id, self.name), *(ToolCallDelta(index, f) for f in self.fragments)]

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolCallDelta:
    """One streaming fragment: the first of a call carries id and name, later ones only arguments text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def as_openai(self) -> dict:
        """The `delta.tool_calls[]` entry of a chat.completion.chunk."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class MalformedToolCall(ValueError):
    pass


def _types(schema: Any) -> list[str]:
    if not isinstance(schema, Mapping):
        return []
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    return [x for sub in [*schema.get("anyOf", ()), *schema.get("oneOf", ())] for x in _types(sub)]


def _convert(raw: str, kind: str) -> tuple[bool, Any]:
    try:
        if kind == "integer":
            return True, int(raw.strip())
        if kind == "number":
            value = json.loads(raw)
            return isinstance(value, (int, float)) and not isinstance(value, bool), value
        if kind == "boolean":
            low = raw.strip().lower()
            return low in ("true", "false"), low == "true"
        if kind == "null":
            return raw.strip().lower() in ("null", "none"), None
        if kind in ("object", "array"):
            value = json.loads(raw)
            return isinstance(value, dict if kind == "object" else list), value
    except (ValueError, RecursionError):  # RecursionError: generated JSON nested past the parser's limit
        pass
    return False, None


def _members(schema: Any) -> list:
    """The enum / const members `schema` allows (anyOf / oneOf branches included)."""
    if not isinstance(schema, Mapping):
        return []
    own = [schema["const"]] if "const" in schema else list(schema.get("enum", ()))
    return own + [m for sub in [*schema.get("anyOf", ()), *schema.get("oneOf", ())] for m in _members(sub)]


def typed_value(raw: str, schema: Any) -> Any:
    """`raw` as the enum member it renders, else converted to the first type of `schema` it parses as; the raw
    string otherwise."""
    members = _members(schema)
    for text in (raw, raw.strip()):
        for m in members:
            if parameter_text(m) == text:
                return m
    kinds = _types(schema)
    if "string" in kinds[:1]:
        return raw
    for kind in kinds:
        ok, value = _convert(raw, kind)
        if ok:
            return value
    return raw


def parse_body(body: str, tools: Sequence[ToolSpec]) -> tuple[str, dict]:
    """(name, arguments) of the text between <tool_call> and </tool_call>; raises MalformedToolCall."""
    m = FUNCTION.fullmatch(body)
    if m is None:
        raise MalformedToolCall("expected <function=NAME> ... </function> inside <tool_call>")
    name, inner = m.group(1).strip(), m.group(2)
    spec = next((t for t in tools if t.name == name), None)
    if spec is None:
        raise MalformedToolCall(f"call of undeclared tool {name!r}")
    props = (spec.parameters or {}).get("properties", {}) if isinstance(spec.parameters, Mapping) else {}
    arguments: dict = {}
    pos = 0
    for p in PARAMETER.finditer(inner):
        if p.start() != pos:
            raise MalformedToolCall(f"unexpected text {inner[pos:p.start()][:40]!r} in call of {name!r}")
        key = p.group(1).strip()
        arguments[key] = typed_value(p.group(2), props.get(key) if isinstance(props, Mapping) else None)
        pos = p.end()
    if inner[pos:].strip():
        raise MalformedToolCall(f"unexpected text {inner[pos:][:40]!r} in call of {name!r}")
    return name, arguments


def argument_fragments(arguments: Mapping[str, Any]) -> list[str]:
    """json.dumps(arguments, ensure_ascii=False), split after each parameter."""
    if not arguments:
        return ["{}"]
    items = list(arguments.items())
    frags = []
    for j, (k, v) in enumerate(items):
        lead = "{" if j == 0 else ", "
        tail = "}" if j == len(items) - 1 else ""
        frags.append(f"{lead}{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}{tail}")
    return frags
