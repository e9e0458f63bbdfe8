"""Incremental detokenization and stop handling, on the real vocabulary."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import joined, stream
from ninfer.contracts import FinishReason
from ninfer.frontend import OutputOptions, OutputSession
from ninfer.frontend.detokenizer import Detokenizer, TokenTable


@pytest.fixture(scope="module")
def table(tok):
    return TokenTable.build(tok)


def session(table, **kw):
    return OutputSession(OutputOptions(**kw), table, reasoning_open=False)


@given(st.lists(st.integers(0, 248076), max_size=30))
def test_incremental_decode_equals_full_decode(tok, table, ids):
    d = Detokenizer(table, skip_special_tokens=False)
    text = "".join(d.push(t) for t in ids) + d.flush()
    assert text == tok.decode(ids)


@given(st.text(max_size=40))
def test_valid_text_never_shows_a_broken_character(tok, table, text):
    d = Detokenizer(table, skip_special_tokens=False)
    pieces = [d.push(t) for t in tok.encode(text)]
    assert "\ufffd" not in "".join(pieces) or "\ufffd" in text
    assert "".join(pieces) + d.flush() == __import__("unicodedata").normalize("NFC", text)


def test_a_dropped_preview_inside_a_character_changes_nothing(tok, table):
    """A preview forks the detokenizer: the first byte of 毕 that a dropped preview leaves unfinished stays in that
    fork, so the committed output decodes as if the preview never ran (a shared decoder would emit U+FFFD + "y")."""
    first_byte = table._raw.token_to_id("æ")  # the first of 毕's three byte-level pieces
    s = session(table)
    s.commit(s.preview(tok.encode("x")))
    s.preview([first_byte])  # dropped: the Engine cut the row
    assert s.commit(s.preview(tok.encode("y"))).text == "y"


def test_skip_special_tokens_keeps_markers(tok, table):
    ids = tok.encode("<|im_start|>a<think>b</think><tool_call>")
    assert "".join(Detokenizer(table, True).push(t) for t in ids) == "a<think>b</think><tool_call>"
    assert "".join(Detokenizer(table, False).push(t) for t in ids).startswith("<|im_start|>a")


def test_stop_string_split_across_tokens(tok, table):
    ids = tok.encode("Hello world, STOP here")
    s = session(table, stop=("STOP",))
    chunks, taken = stream(s, ids)
    assert joined(chunks)[0] == "Hello world, "
    r = s.result()
    assert r.finish_reason is FinishReason.STOP and r.stop_reason == "STOP" and tok.decode(taken).endswith("STOP")
    assert r.content == "Hello world, " and r.completion_tokens == len(taken) < len(ids)


def test_stop_string_inside_a_multibyte_character(tok, table):
    # "毕" is split into byte tokens when preceded by a byte-level fragment; the stop completes with its last byte.
    byte_ids = [table._raw.token_to_id(c) for c in "æ¯ķ"]  # the three byte-level pieces of 毕
    ids = tok.encode("x") + byte_ids + tok.encode("y")
    assert tok.decode(ids) == "x毕y"
    s = session(table, stop=("毕",))
    chunks, taken = stream(s, ids)
    assert joined(chunks)[0] == "x" and len(taken) == 4
    s2 = session(table, stop=("y",))
    chunks, _ = stream(s2, ids)
    assert joined(chunks)[0] == "x毕"


def test_overlapping_stop_strings_take_the_earliest(tok, table):
    ids = tok.encode("abcdef")
    s = session(table, stop=("cdef", "bcd", "zz"))
    chunks, _ = stream(s, ids)
    assert joined(chunks)[0] == "a" and s.result().stop_reason == "bcd"


def test_stop_at_the_very_first_token(tok, table):
    s = session(table, stop=("Hello",))
    p = s.preview(tok.encode("Hello there"))
    assert p.accepted == 1 and p.terminal and p.chunk.text == ""
    s.commit(p)
    assert s.result().content == "" and s.result().completion_tokens == 1
    s2 = session(table)
    p2 = s2.preview([248046, 11, 12])
    # no chat prompt behind this session, so no history to reproduce: no prefix-execution boundary
    assert (p2.accepted, p2.finish_reason, p2.boundary) == (1, FinishReason.STOP, None)


def test_held_text_is_released_when_no_stop_follows(tok, table):
    ids = tok.encode("ab STO") + [248046]
    s = session(table, stop=("STOP",))
    chunks, _ = stream(s, ids)
    assert [c.text for c in chunks][-1].endswith("STO") and joined(chunks)[0] == "ab STO"
    assert "STO" not in "".join(c.text for c in chunks[:-1])


def test_min_tokens_ignores_stops_before(tok, table):
    ids = [248046] + tok.encode("ab") + [248046]
    s = session(table, min_tokens=2, stop=("a",))
    chunks, taken = stream(s, ids)
    assert taken == ids and joined(chunks)[0] == "ab"  # <|im_end|> #1 and 'a' came before min_tokens
    assert len(tok.encode("x y")) == 2
    s2 = session(table, min_tokens=1, stop=("y",))
    chunks, taken = stream(s2, tok.encode("x y") + [248046])
    assert joined(chunks)[0] == "x " and s2.result().stop_reason == "y" and len(taken) == 2


def test_max_tokens_ends_with_length(tok, table):
    s = session(table, max_tokens=3)
    p = s.preview(tok.encode("one two three four five"))
    assert p.accepted == 3 and p.finish_reason is FinishReason.LENGTH
    s.commit(p)
    assert s.result().content == "one two three"


_alphabet = st.sampled_from(list("abc 毕😀\n") + ["ab", "bc", "cab"])


@given(st.lists(_alphabet, min_size=1, max_size=12).map("".join),
       st.lists(st.lists(_alphabet, min_size=1, max_size=3).map("".join), min_size=1, max_size=3),
       st.lists(st.integers(1, 4), max_size=10))
def test_streamed_stops_match_a_full_text_search(tok, table, text, stops, sizes):
    ids = tok.encode(text) + [248046]
    s = session(table, stop=tuple(stops))
    chunks, _ = stream(s, ids, sizes)
    # Reference: the first token whose decoded prefix contains a stop; cut at the earliest occurrence there.
    for k in range(1, len(ids)):
        prefix = tok.decode(ids[:k])
        found = [i for stop in stops if (i := prefix.find(stop)) >= 0]
        if found:
            assert joined(chunks)[0] == prefix[:min(found)]
            return
    assert joined(chunks)[0] == text
