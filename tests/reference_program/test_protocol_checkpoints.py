"""The Program protocol's checkpoints: captures at the prompt end, chunk and turn boundaries (only where
chosen, within the allowance), retained outputs, and resuming from each equal to a cold run."""

from __future__ import annotations

import pytest

from ninfer.contracts import EngineFailure, ResourceChoice, TransitionKind, token_digest
from ninfer.testing.protocol_driving import (assert_baseline, assert_same, capture, cold, finish, generate, materialize,
                                             published, run)


def test_prompt_end_checkpoint_resume_equals_cold(make_program, prompt_of, model32):
    prog, base = make_program(), prompt_of(10)  # 10 % 4: the resume copies a partial page
    h = materialize(prog, base).handle
    generate(prog, h, 2)
    (info,) = capture(prog, h)
    assert info.tokens == 10 and info.digest == token_digest(base)
    finish(prog, h)
    ck = prog.ckpts[info.id]
    prompt = base + prompt_of(7, seed=5)
    r = materialize(prog, prompt, source=info.id)
    assert r.reused_tokens == 10
    seq = prog.sequence(r.handle)
    assert seq.table[:2] == ck.table[:2] and seq.table[2] != ck.table[2]  # full pages shared, partial copied
    assert prog.pages.alloc.refs[ck.table[0]] == 2
    assert_same(generate(prog, r.handle, 5), cold(model32, prompt, 5))
    finish(prog, r.handle)
    run(prog, ResourceChoice(TransitionKind.DELETE, victims=(info.id,)))
    assert prog.resource_usage().free_pages == prog.resource_usage().total_pages


@pytest.mark.parametrize("page_size", [4, 5])
def test_chunk_boundary_checkpoints(make_program, prompt_of, model32, page_size):
    """Boundaries at 64 and 128 whether or not a page ends there (with 5, the boundary shares a partial page)."""
    prog, base = make_program(page_size=page_size), prompt_of(150, seed=3)
    h = materialize(prog, base, max_new=4).handle
    generate(prog, h, 2, chunk=40)
    published = capture(prog, h)
    assert sorted(i.tokens for i in published) == [64, 128, 150]
    finish(prog, h)
    for at, keep in ((128, 140), (64, 100)):
        info = next(i for i in published if i.tokens == at)
        prompt = base[:keep] + prompt_of(20, seed=9)
        r = materialize(prog, prompt, source=info.id)
        assert r.reused_tokens == at
        assert_same(generate(prog, r.handle, 4), cold(model32, prompt, 4))
        finish(prog, r.handle)
    assert_baseline(prog)


def test_retain_publishes_the_conversation(make_program, prompt_of, model32):
    prog, prompt = make_program(), prompt_of(13)
    h = materialize(prog, prompt).handle
    out, _ = generate(prog, h, 4)
    (info,) = finish(prog, h, retain_at=len(prompt) + 3).published
    assert info.tokens == len(prompt) + 3 and info.digest == token_digest(prompt + tuple(out[:3]))
    nxt = prompt + tuple(out) + prompt_of(5, seed=4)
    r = materialize(prog, nxt, source=info.id)
    assert_same(generate(prog, r.handle, 3), cold(model32, nxt, 3))
    with pytest.raises(EngineFailure):
        finish(prog, r.handle, retain_at=3)  # the Engine and the Program disagree on the frontier


def test_captures_stay_within_the_checkpoint_allowance(make_program, prompt_of):
    prog = make_program(max_concurrency=1, checkpoint_slots=1)
    r = materialize(prog, prompt_of(150, seed=3), max_new=2)
    h = r.handle
    assert r.captures == (64, 150)  # live, one capture slot, one from the allowance: 128 was refused
    generate(prog, h, 1, chunk=150)
    assert len(prog.slots.free) == 0
    assert sorted(i.tokens for i in capture(prog, h)) == [64, 150]
    finish(prog, h)
    # Both checkpoints are inactive now: an admission from root may release them.
    r = materialize(prog, prompt_of(20, seed=4), victims=tuple(prog.ckpts))
    assert r.handle is not None


def test_captures_only_where_chosen_displacing_only_allowed_victims(make_program, prompt_of, model32):
    """A turn boundary off the GDN chunk grid is captured where the ResourceManager asked; a capture takes a slot
    from a victim only within `capture_victims`, deleting it unless it is to be demoted."""
    prog = make_program(max_concurrency=1, checkpoint_slots=1)  # 3 slots
    base = prompt_of(30, seed=7)
    r = materialize(prog, base, max_new=2, captures=(21,))
    generate(prog, r.handle, 1, chunk=8)
    (info,) = capture(prog, r.handle)
    assert info.tokens == 21 and info.digest == token_digest(base[:21])
    finish(prog, r.handle)
    prompt = base[:21] + prompt_of(6, seed=8)
    r = materialize(prog, prompt, source=info.id, captures=(25, 27))
    assert r.reused_tokens == 21 and r.captures == (25,)  # no slot left for 27, and no victim allowed
    assert_same(generate(prog, r.handle, 3), cold(model32, prompt, 3))
    (second,) = capture(prog, r.handle)
    finish(prog, r.handle)
    # Both checkpoints hold the other two slots: a capture may displace only the first listed victim.
    victims = (second.id, info.id)
    r = materialize(prog, prompt_of(9, seed=9), max_new=2, victims=victims, captures=(9, 5), capture_victims=1)
    assert r.captures == (9,) and r.released == (second.id,) and info.id in prog.ckpts
    generate(prog, r.handle, 1)
    (third,) = capture(prog, r.handle)
    finish(prog, r.handle)
    r = materialize(prog, prompt_of(9, seed=10), max_new=2, victims=(info.id, third.id), captures=(9,))
    assert r.captures == () and r.released == () and len(prog.ckpts) == 2  # capture_victims=0: none displaced
    finish(prog, r.handle)
    assert_baseline(prog)


def test_a_capture_of_tokens_already_published_publishes_nothing(make_program, prompt_of):
    """Two cold requests over the same prompt: the second's capture finds the same tokens published and frees its
    copy (slot and page references) instead of publishing a twin."""
    prog = make_program()
    first = published(prog, prompt_of(11))
    slots, pages = len(prog.slots.free), prog.alloc.available
    h = materialize(prog, prompt_of(11), source=None).handle
    generate(prog, h, 1)
    assert capture(prog, h) == ()
    finish(prog, h)
    assert list(prog.ckpts) == [first.id] and (len(prog.slots.free), prog.alloc.available) == (slots, pages)
    prog.check_invariants()
