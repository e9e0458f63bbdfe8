"""The Program protocol driven directly: transactions, provisional state, batches, stale plans and handles,
feasibility and the backfill proof."""

from __future__ import annotations

import pytest
import torch

from ninfer.contracts import (BatchKind, EngineFailure, Infeasible, PendingBatch, ResourceChoice, RowDecision,
                              SequenceHandle, StalePlan, TransitionKind)
from ninfer.sampling import SamplingParams
from ninfer.testing.protocol_driving import (assert_baseline, assert_same, cold, finish, generate, materialize,
                                             published, run)


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


def test_abort_after_the_claim_stage_returns_everything(make_program, prompt_of):
    prog, base = make_program(), prompt_of(9)
    info = published(prog, base)
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


def test_a_batch_short_of_provisional_state_is_refused_whole(make_program, prompt_of):
    """A decode batch whose payload lost a row's provisional state (an Engine that rebuilt the batch) is an
    EngineFailure before anything is applied: the row before it is not committed, and aborting the real batch after
    it restores both rows (the commit is whole or nothing)."""
    prog = make_program()
    hs = [materialize(prog, prompt_of(10, seed=s)).handle for s in (1, 2)]
    for h in hs:
        generate(prog, h, 1, chunk=16)
    before = [(prog.sequence(h).frontier, prog.sequence(h).reserve_left) for h in hs]
    batch = prog.decode(hs)
    short = PendingBatch(batch.kind, batch.rows, batch.resource_revision, payload=batch.payload[:1])
    with pytest.raises(EngineFailure, match="lost its provisional state"):
        prog.commit(short.take(), [RowDecision(1, False), RowDecision(1, False)])
    prog.abort_pending(batch.take())
    assert [(prog.sequence(h).frontier, prog.sequence(h).reserve_left) for h in hs] == before
    prog.check_invariants()


def test_a_retain_before_any_token_publishes_nothing(make_program, prompt_of):
    """A sequence ended before its first prefill chunk has no state worth keeping: its retain frees the slot and
    publishes no checkpoint (an empty one would hold a slot for the root, which every request starts from anyway)."""
    prog = make_program()
    h = materialize(prog, prompt_of(10)).handle
    result = finish(prog, h, retain_at=0)
    assert result.succeeded and result.published == ()
    assert_baseline(prog)
    usage = prog.resource_usage()
    assert usage.checkpoints == 0 and usage.free_slots == usage.total_slots, usage
    prog.check_invariants()


def test_a_capture_at_the_materialized_frontier_is_refused(make_program, prompt_of):
    """A capture the prefill cannot pass (at the frontier the sequence starts from: nothing is consumed there) is an
    EngineFailure at the claim, not a reserved slot that prefill later finds already passed."""
    prog = make_program()
    with pytest.raises(EngineFailure, match="outside the prefill"):
        materialize(prog, prompt_of(10), captures=(0, 4))
