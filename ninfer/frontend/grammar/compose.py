"""Compose reasoning, the Qwen XML tool envelope and the final JSON into ONE structural tag.

    [reasoning: any text without <think>/</think>(/<tool_call>) ... "</think>" "\n\n"]   (only if thinking)
    then one of
      json format only          : the final JSON
      tools auto                : free text with triggered tool calls
      tools auto + json format  : one or more tool calls  |  the final JSON
      tools required            : at least one tool call, from the answer's first token
      tool named                : calls of that tool only (one, unless parallel calls are allowed)

The final JSON never has free whitespace (a model that prefers spaces would otherwise fill the answer with them):
`compact` is json.dumps' layout, `pretty` allows any layout with at most PRETTY_MAX_WHITESPACE whitespace
characters in a row. Tool arguments always take the template's own spelling (tool_grammar.py).

Forced calls (required, named, auto + json format) end the turn: after the last permitted call only another
call (parallel calls) or a stop token may follow. Tool calls are spelled as the template renders them
(tool_grammar.py).

Because it is one grammar, a token (or a speculative block) may cross from reasoning into a tool call or the
final JSON with no out-of-band phase switch, and a forced `</think>` is just more text for the same matcher.
Under a grammar the reasoning cannot contain <tool_call>: a constrained turn closes its thinking first.
"""

from __future__ import annotations

from typing import Any

from xgrammar.structural_tag import (AnyTextFormat, ConstStringFormat, JSONSchemaFormat, OrFormat, SequenceFormat,
                                     StructuralTag, TagFormat, TriggeredTagsFormat)

from .options import StructuredOutputOptions, json_safe
from .tool_grammar import CALL_TRIGGER, call_tag, calls_format, compact_json

THINK_END = "</think>"
THINK_SUFFIX = "\n\n"
REASONING_EXCLUDES = ["<think>", "</think>"]
# A newline and an indentation five levels deep at four spaces (or ten at two) still fit.
PRETTY_MAX_WHITESPACE = 20


def final_json(schema: Any, whitespace: str) -> Any:
    """The final JSON answer: `compact` in json.dumps' layout, `pretty` with bounded runs of whitespace."""
    if whitespace == "pretty":
        return JSONSchemaFormat(json_schema=json_safe(schema), max_whitespace_cnt=PRETTY_MAX_WHITESPACE)
    return compact_json(schema)


def _answer(options: StructuredOutputOptions) -> Any:
    fmt = options.response_format
    final = final_json(fmt.final_schema(), options.json_whitespace) if fmt.is_json else None
    tools = options.callable_tools
    if not tools:
        return final if final is not None else AnyTextFormat(excludes=REASONING_EXCLUDES)
    parallel = options.parallel_tool_calls
    mode = options.tool_choice.mode
    if mode in ("named", "required"):
        # The calls come first, as XGrammar's at_least_one does; named: tools holds just that one.
        return calls_format(tools, parallel)
    if final is not None:
        return OrFormat(elements=[calls_format(tools, parallel), final])
    # auto with strict tools: free text with calls anywhere, as the model may write them.
    return TriggeredTagsFormat(triggers=[CALL_TRIGGER], tags=[call_tag(t) for t in tools],
                               excludes=REASONING_EXCLUDES, at_least_one=False, stop_after_first=not parallel)


def structural_tag(options: StructuredOutputOptions, *, reasoning: bool) -> StructuralTag:
    """The one grammar of a request; `reasoning` when the prompt left a <think> block open."""
    answer = _answer(options)
    if not reasoning:
        return StructuralTag(format=answer)
    excludes = REASONING_EXCLUDES + (["<tool_call>"] if options.callable_tools else [])
    think = TagFormat(begin="", content=AnyTextFormat(excludes=excludes), end=THINK_END)
    return StructuralTag(format=SequenceFormat(elements=[think, ConstStringFormat(value=THINK_SUFFIX), answer]))
