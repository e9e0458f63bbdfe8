"""PreparedPrompt identity: digests, cache boundaries, the leading format instruction, context refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corpus import CONVERSATIONS, TOOLS
from ninfer.contracts import RejectReason, RequestRejected
from ninfer.frontend import ChatRequest
from ninfer.frontend.prompt import PrefixDigest, PreparedPrompt, char_to_token_boundaries, prepare_ids

SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@given(st.lists(st.integers(0, 248319), max_size=40), st.data())
def test_prefix_digest_is_the_digest_of_the_prefix(ids, data):
    lengths = data.draw(st.lists(st.integers(1, max(1, len(ids))), max_size=5)) if ids else []
    p = prepare_ids(ids, lengths)
    for b in p.boundaries:
        assert b.digest == prepare_ids(ids[:b.length]).digest
    assert [b.length for b in p.boundaries] == sorted(set(lengths))
    p.check_invariants()


def test_digest_separates_different_tokens():
    assert prepare_ids([1, 2, 3]).digest != prepare_ids([1, 2, 4]).digest
    assert prepare_ids([1, 2, 3]).digest != prepare_ids([1, 2]).digest
    assert prepare_ids([256]).digest != prepare_ids([1, 0]).digest  # not a byte string digest


def test_boundaries_must_increase_within_the_prompt():
    with pytest.raises(ValueError, match="increase strictly"):
        PreparedPrompt((1, 2), "d", (PrefixDigest(2, "a"), PrefixDigest(2, "b")))
    with pytest.raises(ValueError, match="within 1..2"):
        PreparedPrompt((1, 2), "d", (PrefixDigest(3, "a"),))


def test_boundaries_are_system_turn_and_message_ends(fe):
    conv = CONVERSATIONS["parallel_calls"]
    p = fe.prepare_chat(ChatRequest(conv["messages"], conv["tools"])).prompt
    text = p.text
    ends = [len(fe.tokenizer.decode(p.token_ids[:b.length])) for b in p.boundaries]
    assert text[:ends[0]].endswith("</IMPORTANT><|im_end|>\n")  # the tools system turn
    assert text[:ends[1]].endswith("Paris and Rome<|im_end|>\n")
    assert text[:ends[3]].endswith("sunny\n</tool_response>")  # first of two merged tool results
    assert text[:ends[4]].endswith("rainy\n</tool_response><|im_end|>\n")
    assert text[:ends[-1]].endswith("<|im_end|>\n<|im_start|>assistant\n")  # before the opened <think>
    assert len(p.boundaries) == 2 + len(conv["messages"])


def test_a_follow_up_turn_reuses_the_deepest_prefix(fe):
    first = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    a = fe.prepare_chat(ChatRequest(first)).prompt
    b = fe.prepare_chat(ChatRequest(first + [{"role": "assistant", "content": "Hello"},
                                             {"role": "user", "content": "More"}])).prompt
    shared = b.deepest(d.digest for d in a.boundaries)
    assert shared is not None and shared.length == a.boundaries[-2].length  # a's last message end
    assert b.token_ids[:shared.length] == a.token_ids[:shared.length]


def test_builtin_and_jinja_prompts_share_identity(fe, fe_builtin):
    for name, conv in CONVERSATIONS.items():
        r = ChatRequest(conv["messages"], conv.get("tools"), chat_template_kwargs=conv.get("chat_template_kwargs"))
        assert fe.prepare_chat(r).prompt == fe_builtin.prepare_chat(r).prompt, name


def test_format_instruction_leads_and_boundaries_follow_caller_messages(fe):
    msgs = [{"role": "user", "content": "Where?"}, {"role": "assistant", "content": "Paris"},
            {"role": "user", "content": "Again, as JSON"}]
    plain = fe.prepare_chat(ChatRequest(msgs, cache_boundaries=[0, 1])).prompt
    shaped = fe.prepare_chat(ChatRequest(msgs, response_format=SCHEMA, cache_boundaries=[0, 1])).prompt
    assert shaped.text.startswith("<|im_start|>system\nYour final answer must be a single JSON value")
    assert '"required": ["city"]' in shaped.text
    tail = lambda p, b: fe.tokenizer.decode(p.token_ids[:b.length])[-30:]
    assert [tail(shaped, b) for b in shaped.boundaries] == [tail(plain, b) for b in plain.boundaries]
    assert len(shaped.boundaries) == 2
    with_system = fe.prepare_chat(ChatRequest([{"role": "system", "content": "Be brief."}] + msgs,
                                              response_format={"type": "json_object"})).prompt
    assert "a single JSON object and nothing else.\n\nBe brief.<|im_end|>" in with_system.text


def test_instruction_mentions_the_tool_alternative(fe):
    msgs = [{"role": "user", "content": "Weather?"}]
    text = fe.prepare_chat(ChatRequest(msgs, tools=TOOLS, response_format=SCHEMA)).prompt.text
    assert "When you answer without calling a tool, your final answer" in text


def test_bad_cache_boundary_is_rejected(fe):
    with pytest.raises(RequestRejected, match="cache boundary 5"):
        fe.prepare_chat(ChatRequest([{"role": "user", "content": "x"}], cache_boundaries=[5]))


def test_char_boundaries_inside_a_token_are_dropped():
    offsets = [(0, 3), (3, 5), (5, 9)]
    assert char_to_token_boundaries(offsets, [3, 4, 9, 0]) == [1, 3]


def test_context_contract(fe):
    small = type(fe)(fe.tokenizer, max_context=20)
    with pytest.raises(RequestRejected) as e:
        small.prepare_chat(ChatRequest([{"role": "user", "content": "word " * 30}]))
    assert e.value.reason is RejectReason.CONTEXT_TOO_LONG and "exceeds the context of 20" in e.value.message
    with pytest.raises(RequestRejected, match="max_tokens=15"):
        small.prepare_tokens([1] * 10, max_tokens=15)
    assert len(small.prepare_tokens([1] * 10, max_tokens=10)) == 10
    with pytest.raises(RequestRejected, match="not an id"):
        small.prepare_tokens([1, 300000])


@given(st.lists(st.integers(0, 248319), min_size=1, max_size=30), st.data())
def test_digests_are_the_contract_token_digest(ids, data):
    from ninfer.contracts import token_digest
    n = data.draw(st.integers(1, len(ids)))
    p = prepare_ids(ids, [n])
    assert p.digest == token_digest(ids) and p.boundaries[0].digest == token_digest(ids[:n])


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_foreign_template_boundaries_come_from_prefix_renderings(tok):
    from ninfer.frontend import Frontend
    fe = Frontend(tok, max_context=1000, chat_template=CHATML)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Yo"}, {"role": "user", "content": "More"}]
    p = fe.prepare_chat(ChatRequest(msgs)).prompt
    assert p.text == "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs) + \
        "<|im_start|>assistant\n"
    tails = [tok.decode(p.token_ids[:b.length]) for b in p.boundaries]
    assert [t[-12:] for t in tails] == ["S<|im_end|>\n", "Hi<|im_end|>\n"[-12:], "Yo<|im_end|>\n"[-12:],
                                        "More<|im_end|>\n"[-12:]]
    assert not p.reasoning_open


def test_text_prompts_and_sampling_options(fe):
    from ninfer.frontend import OutputOptions
    from ninfer.sampling.params import SamplingParams
    p = fe.prepare_text("Once upon a time")
    assert p.token_ids == tuple(fe.tokenizer.encode("Once upon a time")) and p.boundaries == ()
    o = OutputOptions.create(SamplingParams(max_tokens=9, min_tokens=2, stop_token_ids=(7,)), stop="END")
    assert (o.max_tokens, o.min_tokens, o.stop, o.stop_token_ids) == (9, 2, ("END",), (248046, 248044, 7))
    o = OutputOptions.create(SamplingParams(ignore_eos=True, stop_token_ids=(7,)))
    assert o.stop_token_ids == (7,)
