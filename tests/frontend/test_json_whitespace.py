"""No structured answer can be filled with whitespace: the final JSON's layout whitespace is bounded by the grammar.

A model that prefers whitespace tokens (the embedded random model does) once returned `{` and 4,187 whitespace
characters for a json_schema request. Here random walks through several schemas, json_object included, probe every
position outside a JSON string: fed the longest whitespace token the mask allows, again and again, the matcher
refuses more whitespace within the layout's bound (compact: the one space of ", " / ": "; pretty:
PRETTY_MAX_WHITESPACE), and the walked answers themselves hold no longer run.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from helpers import allowed
from ninfer.frontend import ChatRequest, OutputOptions
from ninfer.frontend.grammar.compose import PRETTY_MAX_WHITESPACE

IM_END = 248046
JSON_SPACE = " \t\n\r"
BOUND = {"compact": 1, "pretty": PRETTY_MAX_WHITESPACE}
SCHEMAS = {
    "json_object": None,
    "nested": {"type": "object", "properties": {
        "id": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "pos": {"type": "object", "properties": {"x": {"type": "number"}, "ok": {"type": "boolean"}},
                "required": ["x", "ok"]}}, "required": ["id", "tags", "pos"]},
    "array": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "maxItems": 4},
    "number": {"type": "number"},
    "any": True,
}


@pytest.fixture(scope="module")
def space_tokens(fe):
    """(ids, character counts) of every token that is JSON whitespace only."""
    ids = [t for t in range(fe.tokenizer.vocab_size)
           if (p := fe.table.piece(t, False)) and not p.decode("latin-1").strip(JSON_SPACE)]
    return np.array(ids), np.array([len(fe.table.piece(t, False)) for t in ids])


@pytest.fixture(scope="module")
def quick_ids(fe):
    """Tokens that close JSON structures quickly, so random walks end."""
    return {t for c in '"}],:0123456789 tfnl-.' if (t := fe.tokenizer.token_to_id(c)) is not None}


def open_json(fe, schema, whitespace, thinking=False):
    fmt = {"type": "json_object"} if schema is None else {"type": "json_schema", "json_schema": {"schema": schema}}
    kwargs = None if thinking else {"enable_thinking": False}
    chat = fe.prepare_chat(ChatRequest([{"role": "user", "content": "q"}], response_format=fmt,
                                       chat_template_kwargs=kwargs, json_whitespace=whitespace))
    session = fe.open_session(chat.prompt, OutputOptions(), chat.structured)
    if thinking:
        session.commit(session.preview(fe.tokenizer.encode("ok\n</think>\n\n")))
    return session


def layout_runs(text: str) -> tuple[list[int], bool]:
    """Lengths of the whitespace runs outside JSON strings, and whether `text` ends inside a string."""
    runs, run, in_string, escaped = [], 0, False, False
    for ch in text:
        if in_string:
            in_string = escaped or ch != '"'
            escaped = not escaped and ch == "\\"
            continue
        if ch in JSON_SPACE:
            run += 1
            continue
        runs, run, in_string = runs + [run], 0, ch == '"'
    return runs + [run], in_string


def most_whitespace(grammar, space_tokens) -> int:
    """Whitespace characters the grammar takes here, the longest allowed whitespace token at a time (on a fork)."""
    ids, sizes = space_tokens
    probe, mask, taken = grammar.fork(), grammar.allocate(1), 0
    while not probe.terminated:
        probe.fill_next(mask)
        ok = np.isin(ids, allowed(mask[0]), assume_unique=True)
        if not ok.any():
            return taken
        best = int(np.argmax(np.where(ok, sizes, -1)))
        assert probe.accept(int(ids[best]))
        taken += int(sizes[best])
        assert taken <= 4 * PRETTY_MAX_WHITESPACE, "whitespace without end"
    return taken


def walk_probing(fe, session, rng, space_tokens, quick_ids, limit=60) -> tuple[str, int]:
    """Random allowed tokens (short ones preferred) until the answer ends; the longest probed whitespace run."""
    ids, worst, mask = [], 0, session.grammar.allocate(1)
    while len(ids) < limit and not session.terminal:
        text = fe.tokenizer.decode(ids)
        if not layout_runs(text)[1]:
            worst = max(worst, most_whitespace(session.grammar, space_tokens))
        session.grammar.fill_next(mask)
        ok = allowed(mask[0])
        quick = [t for t in ok if t in quick_ids]
        if IM_END in ok and rng.random() < 0.5:
            token = IM_END
        else:
            token = int(rng.choice(quick)) if quick and rng.random() < 0.8 else int(ok[rng.randrange(ok.size)])
        session.commit(session.preview([token]))
        ids.append(token)
    return fe.tokenizer.decode([t for t in ids if t != IM_END]), worst


@pytest.mark.parametrize("whitespace", ["compact", "pretty"])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_layout_whitespace_is_bounded_everywhere(fe, space_tokens, quick_ids, name, whitespace):
    rng, bound, seen = random.Random(name + whitespace), BOUND[whitespace], 0
    for i in range(3):
        session = open_json(fe, SCHEMAS[name], whitespace, thinking=i == 2)
        text, worst = walk_probing(fe, session, rng, space_tokens, quick_ids)
        runs, _ = layout_runs(text)
        assert worst <= bound and max(runs) <= bound, (worst, text)
        seen = max(seen, worst)
    if name in ("array", "json_object", "nested"):
        assert seen == bound  # the probes did reach the bound: the walks went through the layout's positions


@pytest.mark.parametrize("whitespace", ["compact", "pretty"])
def test_whitespace_after_the_opening_brace_is_refused_after_the_bound(fe, whitespace):
    session = open_json(fe, None, whitespace)
    session.commit(session.preview(fe.tokenizer.encode("{")))
    (space,) = fe.tokenizer.encode(" ")
    grammar = session.grammar.fork()
    taken = 0
    while grammar.accept(space):
        taken += 1
    assert taken == (0 if whitespace == "compact" else PRETTY_MAX_WHITESPACE)


def test_compact_is_the_json_dumps_layout_and_pretty_takes_indentation(fe):
    value = {"id": 3, "tags": ["a"], "pos": {"x": 1.5, "ok": True}}
    for whitespace, text, ok in (("compact", json.dumps(value), True), ("compact", json.dumps(value, indent=2), False),
                                 ("pretty", json.dumps(value, indent=2), True), ("pretty", json.dumps(value), True),
                                 ("pretty", json.dumps(value, indent=24), False)):
        session = open_json(fe, SCHEMAS["nested"], whitespace)
        probe = session.grammar.fork()
        assert all(probe.accept(t) for t in fe.tokenizer.encode(text) + [IM_END]) is ok, (whitespace, text)


def test_unknown_json_whitespace_is_refused(fe):
    from ninfer.contracts import RequestRejected

    with pytest.raises(RequestRejected, match="json_whitespace must be one of compact, pretty"):
        open_json(fe, None, "airy")
