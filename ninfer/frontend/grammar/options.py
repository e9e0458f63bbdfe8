"""StructuredOutputOptions: what a request asks of its output's structure, as schema data.

It crosses the public Engine boundary unchanged; the Frontend compiles it into a request-owned GrammarState.
Everything XGrammar would silently not enforce is refused here with RequestRejected(UNREPRESENTABLE), so a
compiled grammar never promises more than it checks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..input_bounds import MAX_JSON_DEPTH
from ..messages import ToolSpec, reject

# Keywords XGrammar 0.2.x accepts but does not enforce (measured: a violating document is accepted).
UNENFORCED_KEYWORDS = frozenset({"not", "if", "then", "else", "dependentSchemas", "unevaluatedItems", "$dynamicRef",
                                 "$dynamicAnchor", "$recursiveRef"})
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_VALUES = ("items", "additionalProperties", "propertyNames", "contains", "unevaluatedProperties")
# JSON Schema's type names: XGrammar reads any other `type` as no constraint at all.
JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
# The layouts of a final JSON answer: compact is json.dumps' one line (", " and ": ", no other whitespace); pretty
# lets the model lay it out, at most PRETTY_MAX_WHITESPACE whitespace characters in a row (grammar/compose.py).
JSON_WHITESPACE = ("compact", "pretty")


@dataclass(frozen=True)
class ResponseFormat:
    kind: str = "text"  # "text" | "json_object" | "json_schema"
    schema: Mapping[str, Any] | None = None
    name: str = ""
    strict: bool = True

    @classmethod
    def parse(cls, raw: Any) -> "ResponseFormat":
        """From an OpenAI `response_format` value (None means text)."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping) or raw.get("type") not in ("text", "json_object", "json_schema"):
            raise reject("response_format.type must be one of text, json_object, json_schema")
        if raw["type"] != "json_schema":
            return cls(raw["type"])
        spec = raw.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), (Mapping, bool)):
            raise reject("response_format.json_schema must be an object with a 'schema' object")
        schema = spec.get("schema", {})
        check_schema(schema, "response_format.json_schema.schema")
        return cls("json_schema", _plain(schema, "response_format.json_schema.schema"), str(spec.get("name", "")),
                   bool(spec.get("strict", True)))

    @property
    def is_json(self) -> bool:
        return self.kind != "text"

    def final_schema(self) -> Mapping[str, Any] | bool:
        """The JSON schema of the final answer: any object for json_object."""
        return {"type": "object"} if self.kind == "json_object" else (self.schema if self.schema is not None else True)


@dataclass(frozen=True)
class ToolChoice:
    mode: str = "auto"  # "none" | "auto" | "required" | "named"
    name: str = ""

    @classmethod
    def parse(cls, raw: Any, tools: Sequence[ToolSpec]) -> "ToolChoice":
        if raw is None:
            return cls("auto" if tools else "none")
        if raw in ("none", "auto", "required"):
            if raw == "required" and not tools:
                raise reject("tool_choice 'required' needs at least one tool")
            return cls(raw)
        fn = raw.get("function") if isinstance(raw, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise reject("tool_choice must be none, auto, required or {'type': 'function', 'function': {'name': ...}}")
        if not any(t.name == fn["name"] for t in tools):
            raise reject(f"tool_choice names tool {fn['name']!r}, which is not among the declared tools")
        return cls("named", fn["name"])


@dataclass(frozen=True)
class StructuredOutputOptions:
    response_format: ResponseFormat = ResponseFormat()
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = ToolChoice("none")
    parallel_tool_calls: bool = True
    json_whitespace: str = "compact"  # the final JSON's layout, one of JSON_WHITESPACE

    @classmethod
    def create(cls, *, response_format: Any = None, tools: Sequence[ToolSpec] = (), tool_choice: Any = None,
               parallel_tool_calls: bool = True, json_whitespace: str = "compact") -> "StructuredOutputOptions":
        """Validate OpenAI-shaped fields against the (already normalized) tool specs."""
        tools = tuple(tools)
        for t in tools:
            if t.parameters is not None:
                check_schema(t.parameters, f"tool {t.name!r} parameters")
                if t.parameters.get("type", "object") != "object":
                    raise reject(f"tool {t.name!r} parameters.type must be 'object' (a call's arguments are a JSON "
                                 f"object), got {t.parameters['type']!r}")
        if json_whitespace not in JSON_WHITESPACE:
            raise reject(f"json_whitespace must be one of {', '.join(JSON_WHITESPACE)}, got {json_whitespace!r}")
        return cls(ResponseFormat.parse(response_format), tools, ToolChoice.parse(tool_choice, tools),
                   bool(parallel_tool_calls), json_whitespace)

    @property
    def tools_active(self) -> bool:
        return bool(self.tools) and self.tool_choice.mode != "none"

    @property
    def callable_tools(self) -> tuple[ToolSpec, ...]:
        if not self.tools_active:
            return ()
        if self.tool_choice.mode == "named":
            return tuple(t for t in self.tools if t.name == self.tool_choice.name)
        return self.tools

    @property
    def calls_forced(self) -> bool:
        """tool_choice `required` or a named tool: the answer is tool calls and nothing else."""
        return self.tools_active and self.tool_choice.mode in ("required", "named")

    @property
    def constrained(self) -> bool:
        """Whether a grammar enforces the output: a JSON format, a forced tool call, or a strict tool."""
        forced = self.tool_choice.mode in ("required", "named")
        return self.response_format.is_json or forced or (self.tools_active and any(t.strict for t in self.tools))


def _plain(value: Any, where: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise reject(f"{where} is not JSON data: {e}") from e


def check_schema(schema: Any, where: str, depth: int = 1) -> None:
    """Refuse schema shapes the grammar cannot enforce, naming the keyword and where it sits: unenforced keywords,
    a `$ref` outside the document (XGrammar compiles it to "any JSON"), an unknown `type`, nesting past
    MAX_JSON_DEPTH."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, Mapping):
        raise reject(f"{where} must be a JSON schema object or boolean, got {type(schema).__name__}")
    if depth > MAX_JSON_DEPTH:
        raise reject(f"{where}: schemas nested deeper than {MAX_JSON_DEPTH} levels are not supported")
    bad = UNENFORCED_KEYWORDS.intersection(schema)
    if bad:
        raise reject(f"{where}: JSON schema keyword {sorted(bad)[0]!r} is not supported by structured output")
    if len(schema.get("allOf", ())) > 1:
        raise reject(f"{where}: 'allOf' with more than one subschema is not supported by structured output")
    _check_ref_and_type(schema, where)
    for key in SCHEMA_MAPS:
        subs = schema.get(key) or {}
        if not isinstance(subs, Mapping):
            raise reject(f"{where}.{key} must be an object of schemas")
        for name, sub in subs.items():
            check_schema(sub, f"{where}.{key}.{name}", depth + 1)
    for key in SCHEMA_LISTS:
        subs = schema.get(key) or ()
        if not isinstance(subs, (list, tuple)):
            raise reject(f"{where}.{key} must be a list of schemas")
        for i, sub in enumerate(subs):
            check_schema(sub, f"{where}.{key}[{i}]", depth + 1)
    for key in SCHEMA_VALUES:
        if key in schema:
            check_schema(schema[key], f"{where}.{key}", depth + 1)


def _check_ref_and_type(schema: Mapping[str, Any], where: str) -> None:
    ref = schema.get("$ref")
    if ref is not None and (not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/"))):
        raise reject(f"{where}.$ref: {ref!r} is not a reference inside this schema ('#' or '#/...'); external "
                     "references are not supported by structured output")
    kind = schema.get("type")
    if kind is None:
        return
    kinds = kind if isinstance(kind, list) else [kind]
    unknown = [k for k in kinds if not isinstance(k, str) or k not in JSON_TYPES]
    if unknown or not kinds:
        raise reject(f"{where}.type: {unknown[0] if unknown else kind!r} is not a JSON schema type (one of "
                     f"{', '.join(sorted(JSON_TYPES))})")


def json_safe(schema: Any) -> Any:
    """`schema` with string length bounds rewritten as an equivalent `pattern`.

    NOTE: XGrammar 0.2.9 admits raw control characters (NUL, tab, ...) inside JSON strings that carry
    minLength/maxLength, which is not JSON; its `pattern` strings never do. `^.{min,max}$` counts code points as
    JSON Schema does; the strings it admits carry no escapes, a subset of what the schema allows.
    """
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: json_safe(sub) for name, sub in out[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [json_safe(sub) for sub in out[key]]
    for key in SCHEMA_VALUES:
        if key in out:
            out[key] = json_safe(out[key])
    bounded = "minLength" in out or "maxLength" in out
    if bounded and not {"pattern", "format", "enum", "const"} & out.keys():
        low, high = out.pop("minLength", 0), out.pop("maxLength", None)
        out["pattern"] = f"^.{{{low},{'' if high is None else high}}}$"
    return out
