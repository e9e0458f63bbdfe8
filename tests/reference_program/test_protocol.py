"""The Program protocol driven directly: transactions, provisional state, checkpoints, tiers and failures."""

from __future__ import annotations

import pytest
import torch

from ninfer.contracts import (BatchKind, EngineFailure, Infeasible, ResourceChoice, RowDecision, SequenceHandle,
                              StalePlan, TransitionKind, token_digest)
from ninfer.sampling import SamplingParams

LOGPROBS = SamplingParams(temperature=0.0, logprobs=2)
TOL = 1e-5


def run(prog, choice):
    """Plan, start and advance one transition to its result."""
    plan = prog.plan(choice)
    assert not isinstance(plan, Infeasible), plan
    txn = prog.start(plan)
    result = prog.advance(txn)
    while result is None:
        result = prog.advance(txn)
    prog.check_invariants()
    return result


def every_capture(prog, prompt, source):
    """The prompt end, then every multiple of 64 inside the prompt past the source."""
    start = len(prog.ckpts[source].tokens) if source is not None else 0
    return (len(prompt),) + tuple(range((start // 64 + 1) * 64, len(prompt), 64))


def materialize(prog, prompt, max_new=8, source=None, victims=(), sampling=LOGPROBS, captures=None, **kw):
    captures = every_capture(prog, prompt, source) if captures is None else captures
    return run(prog, ResourceChoice(TransitionKind.MATERIALIZE, prompt=tuple(prompt), max_new_tokens=max_new,
                                    source=source, victims=tuple(victims), sampling=sampling, captures=captures,
                                    **kw))


def generate(prog, handle, n, chunk=7):
    """Prefill in chunks, then decode until n tokens are committed: (tokens, logprobs)."""
    batch = None
    while batch is None:
        batch = prog.prefill(handle, chunk)
        prog.check_invariants()
    tokens, lps = [], []
    while True:
        prog.commit(batch.take(), [RowDecision(1, len(tokens) + 1 == n)])
        tokens.append(batch.rows[0].tokens[0])
        lps.append(batch.rows[0].logprobs[0])
        prog.check_invariants()
        if len(tokens) == n:
            return tokens, lps
        batch = prog.decode([handle])


def cold(model, prompt, n):
    """The oracle: the reference model alone, greedy."""
    state = model.new_state()
    logits = model.prefill(torch.tensor(prompt), state)[-1]
    tokens, lps = [], []
    for _ in range(n):
        tokens.append(int(torch.argmax(logits)))
        lps.append(float(torch.log_softmax(logits.double(), -1)[tokens[-1]]))
        logits = model.decode_step(tokens[-1], state)
    return tokens, lps


def assert_same(got, want):
    assert got[0] == want[0]
    assert max(abs(a - b) for a, b in zip(got[1], want[1])) < TOL


def finish(prog, handle, retain_at=None):
    kind = TransitionKind.RETAIN if retain_at is not None else TransitionKind.RELEASE
    return run(prog, ResourceChoice(kind, handle=handle, capture_at=retain_at))


def assert_baseline(prog):
    u = prog.resource_usage()
    assert u.active_sequences == u.reserved_pages == u.sequence_pages == 0, u
    assert u.free_pages + u.checkpoint_pages == u.total_pages, u


def test_cold_run_equals_the_model(make_program, prompt_of, model32):
    prog, prompt = make_program(), prompt_of(30)
    h = materialize(prog, prompt).handle
    assert_same(generate(prog, h, 6), cold(model32, prompt, 6))
    finish(prog, h)
    assert prog.resource_usage().free_pages == prog.resource_usage().total_pages
    assert_baseline(prog)


def test_provisional_state_does_not_leak(make_program, prompt_of):
    prog = make_program()
    h = materialize(prog, prompt_of(10)).handle
    generate(prog, h, 1, chunk=16)
    before = (prog.sequence(h).frontier, prog.states.recurrent[h.slot].clone())
    first = prog.decode([h])
    prog.abort_pending(first.take())
    again = prog.decode([h])
    assert again.rows == first.rows
    prog.commit(again.take(), [RowDecision(0, True, cancelled=True)])
    assert prog.sequence(h).frontier == before[0]
    assert torch.equal(prog.states.recurrent[h.slot], before[1])
    prog.check_invariants()


def test_decode_batch_rows_equal_solo_runs(make_program, prompt_of, model32):
    prog = make_program()
    prompts = [prompt_of(9, seed=1), prompt_of(23, seed=2)]
    hs = [materialize(prog, p).handle for p in prompts]
    outs = [[], []]
    for h, out in zip(hs, outs):
        batch = prog.prefill(h, 64)
        prog.commit(batch.take(), [RowDecision(1, False)])
        out.append(batch.rows[0].tokens[0])
    for _ in range(4):
        batch = prog.decode(hs)
        assert batch.kind is BatchKind.DECODE and [r.base_frontier for r in batch.rows] == \
            [len(p) + len(o) for p, o in zip(prompts, outs)]
        prog.commit(batch.take(), [RowDecision(1, False)] * 2)
        for out, row in zip(outs, batch.rows):
            out.append(row.tokens[0])
    assert outs == [cold(model32, p, 5)[0] for p in prompts]


def test_control_feeds_forced_tokens(make_program, prompt_of, model32):
    prog, prompt = make_program(), prompt_of(12)
    h = materialize(prog, prompt).handle
    first, _ = generate(prog, h, 1)
    batch = prog.control(h, (5, 6, 7))
    assert batch.kind is BatchKind.CONTROL and batch.rows[0].base_frontier == len(prompt) + 1
    prog.commit(batch.take(), [RowDecision(3, False)])
    assert prog.sequence(h).frontier == len(prompt) + 3 and prog.sequence(h).pending == 7
    nxt = prog.decode([h]).rows[0].tokens[0]
    assert nxt == cold(model32, prompt + (first[0], 5, 6, 7), 1)[0][0]


def test_sampled_rows_follow_seed_and_position(make_program, prompt_of):
    params = SamplingParams(temperature=1.0)
    outs = []
    for _ in range(2):
        prog = make_program()
        h = run(prog, ResourceChoice(TransitionKind.MATERIALIZE, prompt=prompt_of(8), max_new_tokens=6,
                                     sampling=params, seed=123)).handle
        batch, toks = prog.prefill(h, 8), []
        for _ in range(5):
            prog.commit(batch.take(), [RowDecision(1, False)])
            toks.append(batch.rows[0].tokens[0])
            batch = prog.decode([h])
        outs.append(toks)
    assert outs[0] == outs[1]


def test_stale_plan_and_handles(make_program, prompt_of):
    prog = make_program()
    choice = ResourceChoice(TransitionKind.MATERIALIZE, prompt=prompt_of(5), max_new_tokens=4)
    plan = prog.plan(choice)
    h = materialize(prog, prompt_of(6)).handle  # moves the revision
    with pytest.raises(StalePlan):
        prog.start(plan)
    prog.check_invariants()
    finish(prog, h)
    with pytest.raises(EngineFailure):
        prog.prefill(h, 4)
    h2 = materialize(prog, prompt_of(6)).handle
    assert h2.slot == h.slot and h2.generation != h.generation
    with pytest.raises(EngineFailure):
        prog.decode([SequenceHandle(h2.slot, h.generation)])
    with pytest.raises(EngineFailure):
        prog.decode([h2])  # prompt not finished


def test_infeasible_now_versus_permanent(make_program, prompt_of):
    prog = make_program(kv_pages=12, page_size=4, max_context=64)
    too_big = prog.plan(ResourceChoice(TransitionKind.MATERIALIZE, prompt=prompt_of(40), max_new_tokens=20))
    assert isinstance(too_big, Infeasible) and too_big.permanent
    h = materialize(prog, prompt_of(20), max_new=20).handle  # reserves 10 of 12 pages
    busy = prog.plan(ResourceChoice(TransitionKind.MATERIALIZE, prompt=prompt_of(9), max_new_tokens=3))
    assert isinstance(busy, Infeasible) and not busy.permanent
    finish(prog, h)
    assert not isinstance(prog.plan(ResourceChoice(TransitionKind.MATERIALIZE, prompt=prompt_of(9),
                                                   max_new_tokens=3)), Infeasible)


def capture(prog, handle):
    return run(prog, ResourceChoice(TransitionKind.CAPTURE, handle=handle)).published


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


def test_host_tier_place_and_resume(make_program, prompt_of, model32):
    prog, base = make_program(), prompt_of(11)
    h = materialize(prog, base).handle
    generate(prog, h, 1)
    (info,) = capture(prog, h)
    finish(prog, h)
    free, pages = len(prog.slots.free), prog.alloc.available
    run(prog, ResourceChoice(TransitionKind.PLACE, source=info.id))
    # the replica holds the GDN state and all 3 KV pages; the device original is dropped
    assert prog.ckpts[info.id].slot is None and len(prog.slots.free) == free + 1
    assert prog.alloc.available == pages + 3 and prog.ckpts[info.id].table == []
    assert prog.checkpoint_info(info.id).host_bytes == info.device_bytes == prog.host.bytes_for(3)
    prompt = base + (3, 4, 5)
    r = materialize(prog, prompt, source=info.id)  # two stages: copy back from the host replica, then activate
    assert_same(generate(prog, r.handle, 3), cold(model32, prompt, 3))
    finish(prog, r.handle)
    run(prog, ResourceChoice(TransitionKind.PLACE, source=info.id))
    assert prog.ckpts[info.id].slot is not None and not prog.host.entries


def test_victims_released_or_demoted_under_pressure(make_program, prompt_of):
    prog = make_program(max_concurrency=1, checkpoint_slots=0, kv_pages=12, page_size=4, max_context=48)
    h = materialize(prog, prompt_of(16), max_new=4).handle
    generate(prog, h, 1)
    (info,) = capture(prog, h)
    finish(prog, h)
    # Slots short (2 total, the checkpoint holds one, the request wants a capture too), pages fine: the victim the
    # ResourceManager wants demoted moves to the host tier.
    r = materialize(prog, prompt_of(8, seed=1), max_new=4, victims=(info.id,), capture_victims=1,
                    demote=frozenset({info.id}))
    assert r.released == () and prog.ckpts[info.id].slot is None and r.captures == (8,)
    assert [p.id for p in r.placed] == [info.id] and r.placed[0].host_bytes == prog.host.bytes_for(4)
    finish(prog, r.handle)
    # A host replica holds no page: pages short, it is neither needed nor touched.
    r = materialize(prog, prompt_of(30, seed=2), max_new=10, victims=(info.id,))
    assert r.released == () and prog.ckpts[info.id].slot is None
    finish(prog, r.handle)
    run(prog, ResourceChoice(TransitionKind.DELETE, victims=(info.id,)))
    # Pages short and the victim not listed for demotion: it is released.
    h = materialize(prog, prompt_of(16), max_new=4).handle
    generate(prog, h, 1)
    (info,) = capture(prog, h)
    finish(prog, h)
    r = materialize(prog, prompt_of(30, seed=2), max_new=10, victims=(info.id,))
    assert r.released == (info.id,) and not prog.ckpts and not prog.host.entries
    finish(prog, r.handle)
    assert_baseline(prog)


def test_pages_short_a_demoted_victim_frees_its_kv_pages(make_program, prompt_of):
    prog = make_program(max_concurrency=1, checkpoint_slots=0, kv_pages=12, page_size=4, max_context=48)
    h = materialize(prog, prompt_of(16), max_new=4).handle
    generate(prog, h, 1)
    (info,) = capture(prog, h)
    finish(prog, h)
    r = materialize(prog, prompt_of(30, seed=2), max_new=10, victims=(info.id,), demote=frozenset({info.id}))
    assert r.released == () and [p.id for p in r.placed] == [info.id] and prog.ckpts[info.id].table == []
    finish(prog, r.handle)
    assert_baseline(prog)


def test_a_full_host_tier_makes_room_by_the_replicas_below(make_program, prompt_of):
    """A demotion that does not fit the host tier deletes host replicas ranked below it; one ranked above it stays,
    and the victim is deleted instead."""
    prog = make_program(max_concurrency=1, checkpoint_slots=2, kv_pages=40, page_size=4, max_context=48)
    infos = []
    for seed in range(3):  # 3 checkpoints hold 3 of the 4 allocatable slots
        h = materialize(prog, prompt_of(16, seed=seed), max_new=4).handle
        generate(prog, h, 1)
        infos += capture(prog, h)
        finish(prog, h)
    a, b, c = (i.id for i in infos)
    prog.host.budget = prog.host.bytes_for(4)  # room for one replica of 4 pages
    run(prog, ResourceChoice(TransitionKind.PLACE, source=a))
    # the live slot and two captures need one slot more than the 2 free: b gives way, and its demotion deletes the
    # replica of a (ranked below it) to fit
    r = materialize(prog, prompt_of(12, seed=9), max_new=4, victims=(a, b), capture_victims=2, captures=(4, 8),
                    demote=frozenset({b}))
    assert r.released == (a,) and [p.id for p in r.placed] == [b] and prog.ckpts[b].slot is None
    finish(prog, r.handle)
    # three captures need one slot more than the 3 free: c gives way, but the replica of b ranks above it, so c
    # is deleted and b stays
    r = materialize(prog, prompt_of(16, seed=8), max_new=4, victims=(c, b), capture_victims=2, captures=(4, 8, 12),
                    demote=frozenset({c}))
    assert r.released == (c,) and r.placed == () and prog.ckpts[b].slot is None and r.captures == (4, 8, 12)
    finish(prog, r.handle)
    assert_baseline(prog)


def test_abort_after_the_claim_stage_returns_everything(make_program, prompt_of):
    prog, base = make_program(), prompt_of(9)
    h = materialize(prog, base).handle
    generate(prog, h, 1)
    (info,) = capture(prog, h)
    finish(prog, h)
    before = prog.resource_usage()
    txn = prog.start(prog.plan(ResourceChoice(TransitionKind.MATERIALIZE, prompt=base + (1, 2), max_new_tokens=4,
                                              source=info.id)))
    assert prog.advance(txn) is None
    prog.check_invariants()
    result = prog.abort(txn)
    assert not result.succeeded and not prog.seqs
    assert prog.resource_usage() == before
    with pytest.raises(EngineFailure):
        prog.advance(txn)


def test_backfill_proof(make_program, prompt_of):
    prog = make_program(kv_pages=20, page_size=4, max_context=64)
    donor = materialize(prog, prompt_of(20), max_new=20).handle  # 10 pages committed
    head = ResourceChoice(TransitionKind.MATERIALIZE, prompt=prompt_of(30), max_new_tokens=10)  # 10 pages
    small = ResourceChoice(TransitionKind.MATERIALIZE, prompt=prompt_of(4), max_new_tokens=4)  # 2 pages
    assert prog.backfill_feasible(head, [donor], small)  # once the donor ends: 2 + 10 <= 20
    assert not prog.backfill_feasible(head, [], small)  # the donor stays: 10 + 2 + 10 > 20
    big = ResourceChoice(TransitionKind.MATERIALIZE, prompt=prompt_of(30), max_new_tokens=12)  # 11 pages
    assert not prog.backfill_feasible(head, [donor], big)  # the borrower's full reservation leaves 9


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


def test_a_victim_demoted_then_deleted_in_one_room_is_reported_released_only(make_program, prompt_of):
    """The first capture's slot demotes b; the second's demotes c, which needs b's host room: b is released, and the
    result does not also report it placed (the ResourceManager would adopt a placement of a released checkpoint)."""
    prog = make_program(max_concurrency=1, checkpoint_slots=2, kv_pages=40, page_size=4, max_context=48)
    ids = []
    for seed in range(3):
        h = materialize(prog, prompt_of(16, seed=seed), max_new=4).handle
        generate(prog, h, 1)
        ids += [i.id for i in capture(prog, h)]
        finish(prog, h)
    _, b, c = ids
    prog.host.budget = prog.host.bytes_for(4)
    r = materialize(prog, prompt_of(12, seed=9), max_new=4, victims=(b, c), capture_victims=2, captures=(4, 8),
                    demote=frozenset({b, c}))
    assert r.captures == (4, 8) and r.released == (b,) and [p.id for p in r.placed] == [c]
    finish(prog, r.handle)
    assert_baseline(prog)
