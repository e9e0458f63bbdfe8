"""The Qwen XML tool-call grammar, spelled exactly as the chat template renders a call in assistant history.

    <tool_call>\n<function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*</function>\n</tool_call>

XGrammar's own `qwen_xml` style allows any whitespace around every value and writes JSON's `true`/`false`,
so a sampled `c\n\n` left an enum and a constrained turn could not re-render byte for byte. Here VALUE is
exactly what the template writes for the parsed argument (`parameter_text`): raw text for strings, Python's
`True`/`False`/`None`, integers and numbers as JSON numbers, objects and arrays as `tojson`
(`", "` and `": "` separators, no other whitespace). Parameters come in declaration order, required ones
always, and an argument-less call is `<function=f>\n</function>`, as the template renders it.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import xgrammar as xgr
from xgrammar.structural_tag import (AnyTextFormat, ConstStringFormat, GrammarFormat, OrFormat, OptionalFormat,
                                     RegexFormat, SequenceFormat, StarFormat, TagFormat)

from ..messages import ToolSpec
from ..render import parameter_text
from .options import json_safe

CALL_TRIGGER = "<tool_call>\n<function="
CALL_END = "</function>\n</tool_call>"
CALL_SEPARATOR = "\n"  # the template joins parallel calls with one newline
PARAM_END = "\n</parameter>\n"
# A raw string value may not contain what ends it for the parser (</parameter>) or for the channel
# parser, which closes a call at the first </tool_call>.
RAW_EXCLUDES = ["</parameter>", "<tool_call>", "</tool_call>"]
GENERIC_NAME = "[a-zA-Z_][a-zA-Z0-9_]*"
JSON_KINDS = ("integer", "number", "object", "array")
# Numbers the template re-renders unchanged (Python's float repr of the parsed value): at most 8 integer and
# 7 fraction digits (15 significant digits always round-trip through a double), no exponent, no trailing
# fraction zeros but ".0", no "-0", and no "0.0000..." (repr switches to exponent notation below 1e-4).
_SMALL_FRACTION = r"\.0|\.0{0,3}[1-9]([0-9]{0,2}[1-9])?"
_FRACTION = r"\.0|\.[0-9]{0,6}[1-9]"
CANONICAL_NUMBER = rf"-?[1-9][0-9]{{0,7}}({_FRACTION})?|-?0({_SMALL_FRACTION})|0"
NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def compact_json(schema: Any) -> GrammarFormat:
    """A JSON value of `schema` in tojson's (and json.dumps') spelling: ", " and ": ", no other whitespace."""
    grammar = xgr.Grammar.from_json_schema(json.dumps(json_safe(schema)), any_whitespace=False,
                                           separators=(", ", ": "))
    return GrammarFormat(grammar=str(grammar))


def _string_value(schema: Mapping[str, Any]) -> Any | None:
    """A constrained raw string, or None when any raw text will do (the caller ends it with a tag)."""
    if "format" in schema and "pattern" not in schema:
        raise ValueError(f"string 'format' {schema['format']!r} is not supported in tool parameters")
    if "pattern" in schema:
        pattern = schema["pattern"]
        # JSON Schema patterns search; a full match of the unanchored body is a subset of what they allow.
        pattern = pattern[1:] if pattern.startswith("^") else pattern
        pattern = pattern[:-1] if pattern.endswith("$") and not pattern.endswith("\\$") else pattern
        return RegexFormat(pattern=pattern)
    if "minLength" in schema or "maxLength" in schema:
        # Without '<' no value can hold a closing tag; a subset of what the length bounds allow.
        high = schema.get("maxLength")
        return RegexFormat(pattern=f"[^<]{{{schema.get('minLength', 0)},{'' if high is None else high}}}")
    return None


def _types(schema: Mapping[str, Any]) -> list[str]:
    kinds = schema.get("type")
    if isinstance(kinds, str):
        return [kinds]
    return list(kinds) if isinstance(kinds, list) else ["string"]  # untyped: any text, kept raw by the parser


def value_formats(schema: Any) -> list[Any] | None:
    """Alternatives for one parameter's VALUE; None means any raw text (an untyped or plain string value)."""
    if not isinstance(schema, Mapping):
        return None
    if "const" in schema or "enum" in schema:
        members = [schema["const"]] if "const" in schema else list(schema["enum"])
        texts = dict.fromkeys(parameter_text(m) for m in members)
        return [ConstStringFormat(value=t) for t in texts if not any(x in t for x in RAW_EXCLUDES)]
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        out: list[Any] = []
        for branch in branches:
            sub = value_formats(branch)
            if sub is None:
                return None
            out.extend(sub)
        return out
    out = []
    for kind in _types(schema):
        if kind == "string":
            raw = _string_value(schema)
            if raw is None:
                return None
            out.append(raw)
        elif kind == "boolean":
            out += [ConstStringFormat(value="True"), ConstStringFormat(value="False")]
        elif kind == "null":
            out.append(ConstStringFormat(value="None"))
        elif kind == "number" and not set(NUMBER_BOUNDS) & schema.keys():
            out.append(RegexFormat(pattern=CANONICAL_NUMBER))
        elif kind in JSON_KINDS:
            out.append(compact_json({**schema, "type": kind}))
        else:
            raise ValueError(f"unknown JSON schema type {kind!r} in tool parameters")
    return out


def parameter_format(key: str, schema: Any) -> Any:
    begin = f"<parameter={key}>\n"
    values = value_formats(schema)
    if values is None:
        return TagFormat(begin=begin, content=AnyTextFormat(excludes=RAW_EXCLUDES), end=PARAM_END)
    if not values:
        raise ValueError(f"tool parameter {key!r} admits no value that can be written in a tool call")
    value = values[0] if len(values) == 1 else OrFormat(elements=values)
    return SequenceFormat(elements=[ConstStringFormat(value=begin), value, ConstStringFormat(value=PARAM_END)])


def parameters_format(parameters: Any) -> Any:
    """Declared parameters in declaration order: required ones always, optional ones at most once."""
    if not isinstance(parameters, Mapping) or "properties" not in parameters:
        # No declared properties: any named parameters with raw values, as the template would render them.
        generic = SequenceFormat(elements=[ConstStringFormat(value="<parameter="), RegexFormat(pattern=GENERIC_NAME),
                                           TagFormat(begin=">\n", content=AnyTextFormat(excludes=RAW_EXCLUDES),
                                                     end=PARAM_END)])
        empty = isinstance(parameters, Mapping) and parameters.get("additionalProperties") is False
        return ConstStringFormat(value="") if empty else StarFormat(content=generic)
    required = set(parameters.get("required", ()))
    parts = []
    for key, sub in parameters["properties"].items():
        part = parameter_format(key, sub)
        parts.append(part if key in required else OptionalFormat(content=part))
    if not parts:
        return ConstStringFormat(value="")
    return parts[0] if len(parts) == 1 else SequenceFormat(elements=parts)


def call_tag(tool: ToolSpec, begin: str = CALL_TRIGGER) -> TagFormat:
    """One call of `tool`; `begin` drops the trigger where a preceding tag already consumed it."""
    return TagFormat(begin=f"{begin}{tool.name}>\n", content=parameters_format(tool.parameters), end=CALL_END)


def calls_format(tools: tuple[ToolSpec, ...], parallel: bool, first_begin: str = CALL_TRIGGER) -> Any:
    """One call, or (parallel) calls joined by the template's newline; nothing may follow the last one."""
    first = [call_tag(t, first_begin) for t in tools]
    head = first[0] if len(first) == 1 else OrFormat(elements=first)
    if not parallel:
        return head
    tags = [call_tag(t) for t in tools]
    more = SequenceFormat(elements=[ConstStringFormat(value=CALL_SEPARATOR),
                                    tags[0] if len(tags) == 1 else OrFormat(elements=tags)])
    return SequenceFormat(elements=[head, StarFormat(content=more)])
