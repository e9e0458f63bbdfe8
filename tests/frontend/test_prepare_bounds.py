"""Preparation is bounded before its costly steps: a conversation or text that cannot fit the context is refused
before it is rendered, tokenized or hashed, and prefix hashing is one pass over the ids however many boundaries
the prompt has."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ninfer.contracts import RejectReason, RequestRejected, token_digest
from ninfer.frontend import ChatRequest, Frontend
from ninfer.frontend import prompt as prompt_mod
from ninfer.frontend.prompt import digest_prefixes


@given(st.lists(st.integers(0, 248319), min_size=1, max_size=40), st.data())
def test_every_boundary_digest_is_the_contract_digest(ids, data):
    lengths = sorted(data.draw(st.sets(st.integers(1, len(ids)), max_size=8)))
    boundaries, whole = digest_prefixes(ids, lengths)
    assert whole == token_digest(ids)
    assert [(b.length, b.digest) for b in boundaries] == [(n, token_digest(ids[:n])) for n in lengths]


def test_prefix_hashing_reads_each_id_once(monkeypatch):
    """With a boundary after every token, the bytes hashed stay linear in the prompt (quadratic before)."""
    hashed = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def update(self, data):
            hashed.append(len(data))
            self.inner.update(data)

        def copy(self):
            return Counting(self.inner.copy())

        def hexdigest(self):
            return self.inner.hexdigest()

    real = hashlib.blake2b
    monkeypatch.setattr(prompt_mod.hashlib, "blake2b", lambda *a, **kw: Counting(real(*a, **kw)))
    n = 2000
    digest_prefixes(list(range(n)), list(range(1, n)))
    assert sum(hashed) <= 8 * n + 8 * n  # every id's 8 bytes once, plus one 8-byte count per digest


def _forbid(monkeypatch, fe: Frontend, *names: str) -> None:
    def boom(*a, **kw):
        raise AssertionError("costly work ran before the size check")

    for name in names:
        target, attr = (fe.tokenizer, name) if name == "encoding" else (prompt_mod, name)
        monkeypatch.setattr(target, attr, boom)


def test_more_messages_than_the_context_is_refused_before_rendering(tok, monkeypatch):
    fe = Frontend(tok, max_context=64)
    import ninfer.frontend.frontend as frontend_mod

    monkeypatch.setattr(frontend_mod, "normalize_chat", lambda *a: (_ for _ in ()).throw(AssertionError("rendered")))
    with pytest.raises(RequestRejected) as e:
        fe.prepare_chat(ChatRequest([{"role": "user", "content": "a"}] * 65))
    assert e.value.reason is RejectReason.CONTEXT_TOO_LONG and "65 messages" in e.value.message


def test_every_message_takes_a_token(tok):
    """The message-count refusal's premise: each message adds at least one prompt token."""
    fe = Frontend(tok, max_context=4096)
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [{"role": "system", "content": ""}, {"role": "user", "content": ""},
            {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": ""},
            {"role": "tool", "content": ""}, {"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
    counts = [len(fe.prepare_chat(ChatRequest(msgs[:k], add_generation_prompt=False)).prompt) for k in range(2, 8)]
    assert all(b > a for a, b in zip(counts, counts[1:])), counts


def test_text_beyond_the_context_is_refused_before_tokenizing(tok, monkeypatch):
    fe = Frontend(tok, max_context=32)
    _forbid(monkeypatch, fe, "encoding")
    too_long = "x" * (31 * fe.max_token_bytes + 1)
    for prepare in (lambda: fe.prepare_text(too_long), lambda: fe.prepare_chat(ChatRequest(
            [{"role": "user", "content": too_long}]))):
        with pytest.raises(RequestRejected) as e:
            prepare()
        assert e.value.reason is RejectReason.CONTEXT_TOO_LONG


def test_max_token_bytes_bounds_every_piece(tok):
    fe = Frontend(tok, max_context=32)
    rng = random.Random(0)
    ids = [*tok.CONTROL_TOKENS, *rng.sample(range(tok.vocab_size), 3000)]
    longest = max(len(fe.table.piece(i, False)) for i in ids)
    assert 0 < longest <= fe.max_token_bytes
    # The bound is a proof, so it must hold for the longest token the vocabulary has, not just a sample.
    assert fe.max_token_bytes == max(len(fe.table.piece(i, False)) for i in range(tok.vocab_size))


def test_encoding_is_encode(tok):
    text = "Hello, wörld! <|im_start|>user\n 12345 \u2028 tabs\t\tand  spaces"
    enc = tok.encoding(text)
    ref = tok.tokenizer.encode(text, add_special_tokens=False)
    assert enc.ids == ref.ids and enc.offsets == ref.offsets
