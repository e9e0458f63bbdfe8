"""Forced tool calls walked with random allowed tokens: the turn ends right after the last call, every argument
validates against the tool's schema, and the constrained text re-renders byte for byte through the template."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from helpers import allowed
from ninfer.contracts import FinishReason
from ninfer.frontend import ChatRequest, OutputOptions

IM_END = 248046
STOPS = (IM_END, 248044)  # <|im_end|>, <|endoftext|>
PICK = {"type": "function", "function": {"name": "pick", "parameters": {"type": "object", "properties": {
    "color": {"enum": ["red", "green", "c"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
    "x": {"type": "number"}, "flag": {"type": "boolean"}, "none": {"type": "null"},
    "opts": {"type": "object", "properties": {"k": {"type": "integer"}, "on": {"type": "boolean"}},
             "additionalProperties": False},
    "note": {"type": "string"}}, "required": ["color", "flag"]}}}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [PICK, PING]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# Continuations the walk may jump to where the mask is wide open (free text, raw strings, JSON strings).
JUMPS = ["\n</parameter>\n", '"}', "}"]
USER = {"role": "user", "content": "q"}
KWARGS = {"enable_thinking": False}


def walk(session, tok, rng: random.Random, limit=300):
    """Random allowed tokens (a stop token taken half the time it is allowed) until the output ends."""
    jumps = [tok.encode(j) for j in JUMPS]
    mask, ids = session.grammar.allocate(1), []
    while len(ids) < limit and not session.terminal:
        session.grammar.fill_next(mask)
        ok = allowed(mask[0])
        assert ok.size, "empty mask"
        row = [IM_END] if IM_END in ok and rng.random() < 0.5 else None
        if row is None and ok.size > 1000 and rng.random() < 0.5:
            row = next((j for j in rng.sample(jumps, len(jumps)) if _accepts(session, j)), None)
        row = row or [int(ok[rng.randrange(ok.size)])]
        preview = session.preview(row)
        session.commit(preview)
        ids += row[:preview.accepted]
    return ids


def _accepts(session, ids) -> bool:
    probe = session.grammar.fork()
    return all(probe.accept(t) for t in ids)


def rerendered(fe, result) -> str:
    """The assistant turn rebuilt from the parsed output, rendered by the checkpoint's Jinja template."""
    calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for c in result.tool_calls]
    message = {"role": "assistant", "content": result.content, "tool_calls": calls}
    full = fe.prepare_chat(ChatRequest([USER, message], TOOLS, add_generation_prompt=False,
                                       chat_template_kwargs=KWARGS)).prompt.text
    head = fe.prepare_chat(ChatRequest([USER], TOOLS, chat_template_kwargs=KWARGS)).prompt.text
    assert full.startswith(head)
    return full[len(head):]


@pytest.mark.parametrize("choice, parallel", [
    ("required", True), ("required", False), ({"type": "function", "function": {"name": "pick"}}, True),
    ({"type": "function", "function": {"name": "ping"}}, False)])
def test_random_forced_calls_end_the_turn_validate_and_rerender(fe, tok, choice, parallel):
    prepared = fe.prepare_chat(ChatRequest([USER], TOOLS, tool_choice=choice, parallel_tool_calls=parallel,
                                           chat_template_kwargs=KWARGS))
    rng, done = random.Random(f"{choice}{parallel}"), 0
    for _ in range(30):
        s = fe.open_session(prepared.prompt, OutputOptions(), prepared.structured)
        ids = walk(s, tok, rng)
        if not s.terminal:
            continue  # a rare long walk; every mask on it was still checked non-empty
        done += 1
        r, text = s.result(), tok.decode(ids[:-1]) + "<|im_end|>"  # the template ends a turn with <|im_end|>
        assert ids[-1] in STOPS and text.endswith("</tool_call><|im_end|>"), text[-80:]
        assert r.finish_reason is FinishReason.TOOL_CALLS and not r.issues and r.tool_calls
        assert parallel or len(r.tool_calls) == 1
        for c in r.tool_calls:
            jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
        assert rerendered(fe, r) == text + "\n"
    assert done >= 20


def test_enum_value_with_trailing_whitespace_is_refused(fe, tok):
    prepared = fe.prepare_chat(ChatRequest([USER], TOOLS, tool_choice="required", chat_template_kwargs=KWARGS))
    s = fe.open_session(prepared.prompt, OutputOptions(), prepared.structured)
    s.commit(s.preview(tok.encode("<tool_call>\n<function=pick>\n<parameter=color>\nc")))
    assert not _accepts(s, tok.encode("\n\n</parameter>")) and _accepts(s, tok.encode("\n</parameter>"))


@pytest.mark.parametrize("raw, schema, want", [
    ("True", {"type": "boolean"}, True), ("false", {"type": "boolean"}, False), ("None", {"type": "null"}, None),
    ("c\n\n", {"enum": ["a", "c"]}, "c"), ("1", {"enum": ["1", 1]}, "1"), ("2", {"enum": ["1", 2]}, 2),
    ("True", {"anyOf": [{"const": True}, {"type": "string"}]}, True)])
def test_parser_reads_template_and_json_spellings(raw, schema, want):
    from ninfer.frontend.tool_calls import typed_value
    got = typed_value(raw, schema)
    assert got == want and type(got) is type(want)


def test_argument_less_call_is_spelled_as_the_template_renders_it(fe, tok):
    prepared = fe.prepare_chat(ChatRequest([USER], TOOLS, tool_choice="required", chat_template_kwargs=KWARGS))
    s = fe.open_session(prepared.prompt, OutputOptions(), prepared.structured)
    assert _accepts(s, tok.encode("<tool_call>\n<function=ping>\n</function>\n</tool_call>") + [IM_END])
    assert not _accepts(s, tok.encode("<tool_call>\n<function=ping>\n\n</function>"))


@pytest.mark.parametrize("choice, parallel", [
    ("required", True), ("required", False), ({"type": "function", "function": {"name": "ping"}}, True)])
def test_after_the_last_call_only_another_call_or_a_stop(fe, tok, choice, parallel):
    prepared = fe.prepare_chat(ChatRequest([USER], TOOLS, tool_choice=choice, parallel_tool_calls=parallel,
                                           chat_template_kwargs=KWARGS))
    s = fe.open_session(prepared.prompt, OutputOptions(), prepared.structured)
    s.commit(s.preview(tok.encode("<tool_call>\n<function=ping>\n</function>\n</tool_call>")))
    mask = s.grammar.allocate(1)
    s.grammar.fill_next(mask)
    ok = set(allowed(mask[0]).tolist())
    assert ok >= set(STOPS)
    others = [tok.decode([t]) for t in ok - set(STOPS)]
    assert all("\n<tool_call>\n<function=".startswith(t) for t in others) and bool(others) == parallel, others


def test_booleans_are_written_as_the_template_renders_them(fe, tok):
    prepared = fe.prepare_chat(ChatRequest([USER], TOOLS, tool_choice="required", chat_template_kwargs=KWARGS))
    s = fe.open_session(prepared.prompt, OutputOptions(), prepared.structured)
    s.commit(s.preview(tok.encode("<tool_call>\n<function=pick>\n<parameter=color>\nred\n</parameter>\n")))
    flag = "<parameter=flag>\n{}\n</parameter>\n</function>\n</tool_call>"
    assert _accepts(s, tok.encode(flag.format("True"))) and _accepts(s, tok.encode(flag.format("False")))
    assert not _accepts(s, tok.encode(flag.format("true")))


def _typed_tool(schema):
    return [{"type": "function", "function": {"name": "t", "parameters": {
        "type": "object", "properties": {"v": schema}, "required": ["v"]}}}]


@pytest.mark.parametrize("schema, good, bad", [
    ({"type": "string", "pattern": "^[a-z]+$"}, "abc", "ab1"),
    ({"type": "string", "maxLength": 3}, "a\nb", "abcd"),
    ({"type": "number"}, "2.5", "2.50"),
    ({"type": "array", "items": {"type": "integer"}}, "[1, 2]", "[1,2]"),
    ({"type": ["integer", "null"]}, "None", "null")])
def test_typed_values_have_one_spelling(fe, tok, schema, good, bad):
    prepared = fe.prepare_chat(ChatRequest([USER], _typed_tool(schema), tool_choice="required",
                                           chat_template_kwargs=KWARGS))
    s = fe.open_session(prepared.prompt, OutputOptions(), prepared.structured)
    s.commit(s.preview(tok.encode("<tool_call>\n<function=t>\n<parameter=v>\n")))
    end = "\n</parameter>\n</function>\n</tool_call>"
    assert _accepts(s, tok.encode(good + end)) and not _accepts(s, tok.encode(bad + end))


def test_string_format_in_a_tool_parameter_is_refused(fe):
    from ninfer.contracts import RequestRejected
    prepared = fe.prepare_chat(ChatRequest([USER], _typed_tool({"type": "string", "format": "date"}),
                                           tool_choice="required", chat_template_kwargs=KWARGS))
    with pytest.raises(RequestRejected, match="'format' 'date' is not supported"):
        fe.open_session(prepared.prompt, OutputOptions(), prepared.structured)
