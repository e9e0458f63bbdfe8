"""Structured output through XGrammar on the real padded vocabulary: blanking, composition, masks, rejections."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus import TOOLS
from helpers import allowed, stream
from ninfer.contracts import EngineFailure, FinishReason, RejectReason, RequestRejected
from ninfer.frontend import ChatRequest, OutputOptions

IM_END, IM_START, IMAGE_PAD, TOOL_RESPONSE = 248046, 248045, 248056, 248066
VOCAB = 248320


def open_structured(fe, thinking=False, tools=None, options=None, **request):
    kwargs = None if thinking else {"enable_thinking": False}
    prepared = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}], tools, chat_template_kwargs=kwargs,
                                           **request))
    return fe.open_session(prepared.prompt, options or OutputOptions(), prepared.structured)


@pytest.fixture(scope="module")
def short_ids(tok):
    """Single-character tokens that close JSON structures quickly, so random walks terminate."""
    return np.array(sorted({tok.token_to_id(c) for c in '"}],:0123456789 tfnl-.' if tok.token_to_id(c) is not None}))


def walk(session, rng: random.Random, short_ids, limit=400):
    """Sample random allowed tokens (biased to short ones and to stopping) until the grammar ends."""
    mask = session.grammar.allocate(1)
    ids = []
    for _ in range(limit):
        session.grammar.fill_next(mask)
        words = mask[0].numpy()
        bit = lambda t: (words[t >> 5] >> (t & 31)) & 1
        short = short_ids[bit(short_ids) == 1]
        if bit(IM_END) and rng.random() < 0.5:
            token = IM_END
        elif short.size and rng.random() < 0.7:
            token = int(short[rng.randrange(short.size)])
        else:
            ok = allowed(mask[0])
            token = int(ok[rng.randrange(ok.size)])
        ids.append(token)
        session.commit(session.preview([token]))
        session.check_invariants()
        if session.terminal:
            return ids
    return None


_leaf = st.one_of(
    st.just({"type": "string"}),
    st.builds(lambda lo, n: {"type": "string", "minLength": lo, "maxLength": lo + n}, st.integers(0, 3),
              st.integers(0, 4)),
    st.lists(st.text("ab毕", max_size=3), min_size=1, max_size=3, unique=True).map(lambda v: {"enum": v}),
    st.builds(lambda lo, n: {"type": "integer", "minimum": lo, "maximum": lo + n}, st.integers(-50, 50),
              st.integers(0, 100)),
    st.sampled_from([{"type": "number"}, {"type": "boolean"}, {"type": "null"}, {"type": "integer"}]))


def _object(children):
    props = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), children, max_size=3)
    return props.flatmap(lambda p: st.sets(st.sampled_from(sorted(p)) if p else st.nothing()).map(
        lambda req: {"type": "object", "properties": p, "required": sorted(req), "additionalProperties": False}))


schemas = st.recursive(_leaf, lambda c: st.one_of(
    _object(c), st.builds(lambda i, n: {"type": "array", "items": i, "maxItems": n}, c, st.integers(0, 3)),
    st.lists(c, min_size=2, max_size=2).map(lambda xs: {"anyOf": xs})), max_leaves=6)


@settings(max_examples=15)
@given(schemas, st.randoms(use_true_random=False), st.booleans())
def test_random_walks_always_validate(fe, short_ids, schema, rng, thinking):
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    s = open_structured(fe, thinking=thinking, response_format=fmt)
    if thinking:
        s.commit(s.preview(fe.tokenizer.encode("Let me think.\n</think>\n\n")))
    ids = walk(s, rng, short_ids)
    if ids is None:
        return  # a rare long walk: nothing to validate, the per-step mask checks above still ran
    r = s.result()
    assert r.finish_reason is FinishReason.STOP and ids[-1] in (IM_END, 248044)
    jsonschema.validate(json.loads(r.content), schema)
    assert r.reasoning == ("Let me think." if thinking else "")


def test_json_object_mode_blanks_control_tokens(fe, tok):
    s = open_structured(fe, response_format={"type": "json_object"})
    s.commit(s.preview(tok.encode('{"k": "')))
    mask = s.grammar.allocate(1)
    s.grammar.fill_next(mask)
    ok = set(allowed(mask[0]).tolist())
    assert not ok & {IM_START, IMAGE_PAD, TOOL_RESPONSE, IM_END, 248100}
    assert tok.token_to_id("hello") in ok
    with pytest.raises(EngineFailure, match="violates the request's grammar"):
        s.preview([IM_START])


_weather_args = st.fixed_dictionaries({"city": st.text("ab 毕\n", min_size=1, max_size=6).map(str.strip).filter(bool)}, optional={
    "days": st.integers(-9, 99), "metric": st.booleans(), "hours": st.lists(st.integers(0, 23), max_size=3),
    "opts": st.dictionaries(st.sampled_from("xy"), st.integers(0, 3), max_size=2)})


@settings(max_examples=25)
@given(choice=st.sampled_from(["required", {"type": "function", "function": {"name": "get_weather"}}]),
       args=st.lists(_weather_args, min_size=1, max_size=2))
def test_forced_tool_calls_are_accepted_and_parsed(fe, choice, args):
    declared = list(TOOLS[0]["function"]["parameters"]["properties"])
    args = [{k: a[k] for k in declared if k in a} for a in args]
    from corpus import call
    from ninfer.frontend.render import tool_calls_text
    s = open_structured(fe, thinking=True, tools=TOOLS, tool_choice=choice)
    # The grammar spells calls as the template renders them, Python's True/False included.
    text = "Need weather.\n</think>\n\n" + tool_calls_text([call("get_weather", **a) for a in args], "")
    # Declaration order: the grammar holds parameters to the order the tool declares them.
    stream(s, fe.tokenizer.encode(text) + [IM_END], [5, 1, 17, 3])
    r = s.result()
    assert r.finish_reason is FinishReason.TOOL_CALLS and not r.issues
    assert [json.loads(c.arguments) for c in r.tool_calls] == args
    for c in r.tool_calls:
        jsonschema.validate(json.loads(c.arguments), TOOLS[0]["function"]["parameters"])


@pytest.mark.parametrize("bad", ["<parameter=dayz>\n3\n</parameter>\n", "<parameter=days>\nmany\n</parameter>\n"])
def test_forced_tool_call_grammar_refuses_wrong_arguments(fe, bad):
    s = open_structured(fe, thinking=False, tools=TOOLS, tool_choice="required")
    head = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    ids = fe.tokenizer.encode(head + bad + "</function>\n</tool_call>")
    with pytest.raises(EngineFailure, match="violates"):
        stream(s, ids)


def test_auto_tools_with_json_offer_both_branches(fe, tok):
    fmt = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"x": {"type": "integer"}},
                                                             "required": ["x"]}}}
    call_text = "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n</function>\n</tool_call>"
    for text, want in ((call_text, FinishReason.TOOL_CALLS), ('{"x": 4}', FinishReason.STOP)):
        s = open_structured(fe, thinking=True, tools=TOOLS, response_format=fmt)
        # One multi-token row crosses </think> into the answer: no phase switch outside the grammar.
        row = tok.encode("Hmm.\n</think>\n\n" + text) + [IM_END]
        p = s.preview(row)
        assert p.accepted == len(row)
        s.commit(p)
        assert s.result().finish_reason is want
    s = open_structured(fe, thinking=True, tools=TOOLS, response_format=fmt)
    with pytest.raises(EngineFailure):
        s.preview(tok.encode("Hmm.\n</think>\n\nplain words"))
    assert s.grammar.accepted_tokens == 0  # the failed preview advanced nothing


def test_reasoning_cannot_open_a_call_under_a_grammar(fe, tok):
    s = open_structured(fe, thinking=True, tools=TOOLS, tool_choice="required")
    with pytest.raises(EngineFailure):
        s.preview(tok.encode("x") + [248058])


def test_draft_bitmask_columns(fe, tok):
    s = open_structured(fe, response_format={"type": "json_object"})
    drafts = tok.encode('{"a": 1}') + [IM_END, 5]
    out = s.grammar.allocate(len(drafts) + 1)
    reachable = s.grammar.fill_bitmask(drafts, out)
    assert reachable == drafts.index(IM_END) + 1  # rows after the EOS draft are unreachable
    probe = s.grammar.fork()
    row = s.grammar.allocate(1)
    for i in range(reachable):
        probe_mask = probe.fork()
        probe_mask.fill_next(row)
        assert torch.equal(out[i], row[0]) and bool(out[i].any())
        if i < len(drafts):
            probe.accept(drafts[i])
    assert bool((out[reachable:] == -1).all())
    assert s.grammar.accepted_tokens == 0  # filling never advances the request's grammar
    illegal = tok.encode("{") + [tok.token_to_id("x")] + tok.encode('"')
    out2 = s.grammar.allocate(4)
    assert s.grammar.fill_bitmask(illegal, out2) == 2 and bool((out2[2:] == -1).all())


def test_thinking_budget_suffix_goes_through_the_matcher(fe, tok):
    s = open_structured(fe, thinking=True, response_format={"type": "json_object"},
                        options=OutputOptions(thinking_budget=2, max_tokens=100))
    s.commit(s.preview(tok.encode("one two three")))
    suffix = s.control_suffix()
    s.commit(s.preview(suffix, forced=True))
    assert s.grammar.accepted_tokens == s.generated
    mask = s.grammar.allocate(1)
    s.grammar.fill_next(mask)
    assert tok.token_to_id("{") in set(allowed(mask[0]).tolist())  # the grammar left the reasoning phase
    stream(s, tok.encode('{"a": true}') + [IM_END])
    assert json.loads(s.result().content) == {"a": True} and s.result().reasoning == "one two three"


def _nested_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize("request_fields, needle", [
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "string", "not": {}}}}),
     "keyword 'not'"),
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": {"allOf": [{}, {}]}}}), "allOf"),
    (dict(response_format={"type": "yaml"}), "response_format.type"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "missing"}}), "'missing'"),
    (dict(tool_choice="required"), "needs at least one tool"),
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}),
     "schema.type: 'strin' is not a JSON schema type"),
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}}}),
     "properties.a.$ref: 'https://example.com/a.json' is not a reference inside this schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": {"type": ["string", "bogus"]}}}),
     "'bogus' is not a JSON schema type"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}]),
     "tool 'f' parameters.type"),
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": _nested_schema(70)}}),
     "nested deeper than 64"),
])
def test_unrepresentable_structure_is_rejected_before_admission(fe, request_fields, needle):
    with pytest.raises(RequestRejected) as e:
        open_structured(fe, **request_fields)
    assert e.value.reason is RejectReason.UNREPRESENTABLE and needle in e.value.message


def test_schema_the_compiler_refuses_is_rejected(fe):
    bad = {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(("}}}
    with pytest.raises(RequestRejected, match="cannot be compiled"):
        open_structured(fe, response_format=bad)


def test_compiler_cache_is_bounded(compiler):
    assert compiler.compiler.cache_limit_bytes == 256 << 20
    assert compiler.info.vocab_size == VOCAB


def test_next_token_mask_is_the_committed_grammar_row(fe, tok):
    s = open_structured(fe, response_format={"type": "json_object"})
    first = s.next_token_mask()
    assert first.shape == (7760,) and first.dtype == torch.int32
    assert tok.token_to_id("{") in set(allowed(first).tolist())
    s.commit(s.preview(tok.encode("{")))
    row = s.grammar.allocate(1)
    s.grammar.fill_next(row)
    assert torch.equal(s.next_token_mask(), row[0])


def test_a_grammar_that_takes_a_stop_token_ends_the_output(fe, tok):
    s = open_structured(fe, response_format={"type": "json_object"}, options=OutputOptions(stop_token_ids=()))
    p = s.preview(tok.encode("{}") + [IM_END, 11])
    assert s.grammar.accepted_tokens == 0  # a preview is a fork until committed
    assert (p.accepted, p.finish_reason) == (len(tok.encode("{}")) + 1, FinishReason.STOP)
    s.commit(p)
    assert s.result().content == "{}" and s.grammar.terminated


def test_draft_columns_cross_think_end(fe, tok):
    s = open_structured(fe, thinking=True, response_format={"type": "json_object"})
    drafts = tok.encode("ok\n</think>\n\n{}") + [IM_END]
    out = s.grammar.allocate(len(drafts) + 1)
    assert s.grammar.fill_bitmask(drafts, out) == len(drafts)
    think_end = drafts.index(248069)
    before, after = (set(allowed(out[i]).tolist()) for i in (think_end, think_end + 2))
    assert 248069 in before and tok.token_to_id("hello") in before  # reasoning: free text or </think>
    assert tok.token_to_id("hello") not in after and tok.token_to_id("{") in after  # the answer: JSON only


def test_length_bounded_strings_admit_no_raw_control_characters(fe, tok):
    # XGrammar 0.2.9 alone lets NUL into '{"type": "string", "maxLength": 5}'; the Frontend rewrites the bound.
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 1, "maxLength": 3}},
              "required": ["s"]}
    s = open_structured(fe, response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    s.commit(s.preview(tok.encode('{"s": "')))
    with pytest.raises(EngineFailure):
        s.preview(tok.encode("\x00"))
    stream(s, tok.encode('毕ab"}') + [IM_END])
    assert json.loads(s.result().content) == {"s": "毕ab"}


def test_a_grammar_dead_end_is_an_empty_mask_not_an_engine_failure():
    """A mask that allows nothing (a request's own schema can reach one) reaches the sampler as it is, which ends
    that request alone with NOTHING_ALLOWED (docs/sampling.md section 8)."""
    from ninfer.contracts import RowFailure
    from ninfer.frontend.grammar.state import GrammarState
    from ninfer.sampling import SamplingError, SamplingParams, draw

    class DeadEnd:
        def is_terminated(self):
            return False

        def fill_next_token_bitmask(self, out, row):
            out[row].zero_()
            return True

    state = GrammarState(DeadEnd(), 97)
    mask = state.allocate(1)
    state.fill_next(mask)
    assert not mask[0].any()
    with pytest.raises(SamplingError) as e:
        draw(torch.randn(97), SamplingParams(), 1, 0, prompt=(), outputs=(), eos_token_ids=(), mask=mask[0])
    assert e.value.failure is RowFailure.NOTHING_ALLOWED
