"""The fast Program driven directly through the protocol: a dropped or cancelled decode/control step leaves the
committed GDN state, pages and reservation exactly as before; plans go stale; the memory plan is the pools."""

from __future__ import annotations

import pytest
import torch

from ninfer.contracts import (BatchKind, EngineFailure, ResourceChoice, RowDecision, RowFailure, StalePlan,
                              TransitionKind)
from ninfer.testing.serving import run_transition as run


def ready(program, prompt, max_new=6):
    """A sequence past its prompt, with its first output token committed (pending)."""
    handle = run(program, ResourceChoice(TransitionKind.MATERIALIZE, request_id=1, prompt=prompt,
                                         max_new_tokens=max_new)).handle
    batch = program.prefill(handle, len(prompt))
    program.commit(batch.take(), [RowDecision(1, False)])
    return handle


def committed(program, handle):
    """The committed physical state of a sequence: its GDN slot (conv, S), block table and occupancy."""
    seq = program.sequence(handle)
    pools = program.model.pools
    return (pools.conv[:, handle.slot].clone(), pools.ssm[:, handle.slot].clone(), list(seq.table),
            seq.reserve_left, seq.frontier, seq.pending, program.resource_usage())


def assert_same(a, b):
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "GDN state not restored"
    assert a[2:] == b[2:]


@pytest.mark.parametrize("step", ["decode", "control"])
@pytest.mark.parametrize("how", ["abort_pending", "cancelled"])
def test_rejected_step_restores_committed_state(make_fast, prompt_of, step, how):
    """The prompt ends at a page boundary (8 tokens, pages of 4), so the step takes a new page it must return."""
    program = make_fast()
    handle = ready(program, prompt_of(8, seed=1))
    program.check_invariants()
    before = committed(program, handle)
    run_step = (lambda: program.decode([handle])) if step == "decode" else (lambda: program.control(handle, (5, 6)))
    first = run_step()
    assert len(program.sequence(handle).table) > len(before[2]), "the step should have grown a page"
    if how == "abort_pending":
        program.abort_pending(first.take())
    else:
        program.commit(first.take(), [RowDecision(0, True, cancelled=True)] * len(first.rows))
    assert_same(committed(program, handle), before)
    program.check_invariants()
    again = run_step()  # the same step from the restored state produces the same tokens
    assert again.rows[0].tokens == first.rows[0].tokens
    program.commit(again.take(), [RowDecision(again.rows[0].produced, False)])
    assert program.sequence(handle).frontier == before[4] + len(again.rows[0].tokens)
    program.check_invariants()


def test_stale_plan_and_stale_handle(make_fast, prompt_of):
    program = make_fast()
    handle = ready(program, prompt_of(5, seed=2))
    plan = program.plan(ResourceChoice(TransitionKind.MATERIALIZE, request_id=2, prompt=prompt_of(4), max_new_tokens=2))
    run(program, ResourceChoice(TransitionKind.RELEASE, handle=handle))
    with pytest.raises(StalePlan):
        program.start(plan)
    with pytest.raises(EngineFailure, match="stale or unknown"):
        program.decode([handle])
    program.check_invariants()
    u = program.resource_usage()
    assert u.free_pages == u.total_pages and u.free_slots == u.total_slots


def test_plan_sizes_the_pools(make_fast):
    """Rows = lanes, slots = allocatable + one backup per row (+ the plan's dummy, then, plain decoding, one chained
    backup per row), pages = the cap."""
    program = make_fast(max_concurrency=3, checkpoint_slots=2, kv_pages=70)
    plan, pools = program.model.plan, program.model.pools
    assert (plan.max_seqs, plan.slots, plan.num_pages, plan.chain_slots) == (3, 2 * 3 + 2 + 3, 70, 1)
    assert pools.block_tables.shape[0] == 4 and pools.ssm.shape[1] == plan.slots + 1 + 3
    assert [plan.chain_backup(r) for r in range(3)] == [plan.slots + 1 + r for r in range(3)]
    u = program.resource_usage()
    assert (u.total_slots, u.total_pages) == (8, 70)


def test_prefill_batch_is_one_sampled_row(make_fast, prompt_of):
    program = make_fast()
    handle = run(program, ResourceChoice(TransitionKind.MATERIALIZE, request_id=1, prompt=prompt_of(10, seed=3),
                                         max_new_tokens=3)).handle
    assert program.prefill(handle, 4) is None and program.prompt_remaining(handle) == 6
    batch = program.prefill(handle, 6)
    assert batch.kind is BatchKind.PREFILL and batch.rows[0].base_frontier == 10
    program.abort_pending(batch.take())  # prompt tokens are not provisional: the frontier stays
    assert program.prompt_remaining(handle) == 0 and program.sequence(handle).pending is None
    program.check_invariants()


def test_masks_gate_prefill_and_decode_draws(make_fast, prompt_of):
    """A mask allowing one token decides its row's draw on the device (bool masks are packed to xgrammar's
    bitmask); an unmasked greedy row in the same round equals an unmasked run."""
    program = make_fast()
    prompt = prompt_of(6, seed=4)
    handle = run(program, ResourceChoice(TransitionKind.MATERIALIZE, request_id=1, prompt=prompt,
                                         max_new_tokens=4)).handle
    V = program.limits.vocab_size
    only = lambda t: torch.arange(V) == t  # noqa: E731  [V] bool
    batch = program.prefill(handle, len(prompt), mask=only(17))
    assert batch.rows[0].tokens == (17,)
    program.commit(batch.take(), [RowDecision(1, False)])
    other = ready(program, prompt_of(9, seed=5))
    plain = program.decode([other])
    program.abort_pending(plain.take())
    both = program.decode([handle, other], masks=[only(42), None])
    assert both.rows[0].tokens == (42,) and both.rows[1].tokens == plain.rows[0].tokens
    program.commit(both.take(), [RowDecision(1, False), RowDecision(1, False)])
    program.check_invariants()


def test_failed_row_is_restored_and_the_others_commit(make_fast, prompt_of):
    """A decode round of two rows where one row's mask allows nothing: that row comes back failed with no tokens,
    a cancelled-row decision restores its slot and pages exactly, and the other row commits as usual."""
    program = make_fast()
    ok, bad = ready(program, prompt_of(8, seed=2)), ready(program, prompt_of(8, seed=3))
    before_ok, before_bad = committed(program, ok), committed(program, bad)
    nothing = torch.zeros(program.limits.vocab_size, dtype=torch.bool)
    batch = program.decode([ok, bad], [None, nothing])
    assert batch.rows[1].failure is RowFailure.NOTHING_ALLOWED and batch.rows[1].tokens == ()
    assert batch.rows[0].failure is None and len(batch.rows[0].tokens) == 1
    program.commit(batch.take(), [RowDecision(1, False), RowDecision(0, True, cancelled=True)])
    assert_same(committed(program, bad)[:-1], before_bad[:-1])  # the usage also counts the other row's new page
    assert committed(program, ok)[4] == before_ok[4] + 1
    program.check_invariants()
    # the restored row draws from its committed state: the same token a round without the failure draws for it
    again = program.decode([bad])
    fresh = make_fast()
    ready(fresh, prompt_of(8, seed=2))
    twin = ready(fresh, prompt_of(8, seed=3))
    assert again.rows[0].tokens == fresh.decode([twin]).rows[0].tokens
