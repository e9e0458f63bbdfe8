"""Steps chained behind an adopted round (docs/engine.md "Async scheduling", `ninfer/program_core/chain.py`) on the
fast Program (naive kernels on CPU, Triton and CUDA graphs on the GPU): a chained step becomes the next round when
its batch commits whole, and every rejection, ending row and abort leaves exactly the state of a Program that never
chained (GDN slot, block table, reservation, frontier, pending token, usage)."""

from __future__ import annotations

import pytest
import torch

from ninfer.contracts import RowDecision
from ninfer.sampling import SamplingParams
from ninfer.testing.siblings import sibling
from ninfer.testing.spec_driving import start_decoding

# 4 tokens: the first step takes a new page (pages of 4), its chained step none; 7 tokens: the reverse
PROMPTS = [(3, 5, 7, 9), (2, 4, 6, 8, 10, 12, 14)]
ACCEPT, REJECT = RowDecision(1, False), RowDecision(0, True, cancelled=True)


def _props():
    return sibling(__file__, "test_properties.py")


def _rows(max_new: int = 12, prompts=PROMPTS, **choice):
    program = _props()._program()
    return program, [start_decoding(program, p, max_new, **choice) for p in prompts]


def _committed(program, handle):
    seq = program.sequence(handle)
    pools = program.model.pools
    return (pools.conv[:, handle.slot].clone(), pools.ssm[:, handle.slot].clone(), list(seq.table),
            seq.reserve_left, seq.frontier, seq.pending)


def _assert_same(a, b):
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "GDN state differs"
    assert a[2:] == b[2:]


def _sync_states(rounds: int):
    """Each row's committed state after `rounds` synchronous decode rounds of both rows, and each round's rows."""
    program, hs = _rows()
    batches = []
    for _ in range(rounds):
        batch = program.decode(hs)
        batches.append(batch.rows)
        program.commit(batch.take(), [ACCEPT, ACCEPT])
    return [_committed(program, h) for h in hs], batches, program.resource_usage()


def _adopt(program, hs, rounds: int):
    """Launch ahead, then `rounds` - 1 rounds adopted and committed whole (each chaining the next), then one more
    adopted round, returned uncommitted with a step chained behind it."""
    assert program.launch_ahead(hs)
    for _ in range(rounds - 1):
        batch = program.decode(hs)
        program.commit(batch.take(), [ACCEPT, ACCEPT])
        assert program.ahead_handles() == tuple(hs)  # the chained step is the round launched ahead now
        assert program.launch_ahead(hs)  # which the Engine's launch keeps
    batch = program.decode(hs)
    assert program.ahead_chained == rounds and program.ahead_launched == 1 + rounds and program.ahead_adopted == rounds
    return batch


@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_chained_steps_are_the_synchronous_rounds(rounds):
    """Round after round (backups alternating between the two banks) the chained steps draw and commit exactly the
    synchronous rounds."""
    want, rows, usage = _sync_states(rounds + 1)
    program, hs = _rows()
    batch = _adopt(program, hs, rounds)
    assert batch.rows == rows[rounds - 1]
    program.commit(batch.take(), [ACCEPT, ACCEPT])
    last = program.decode(hs)  # adopts the step chained behind the committed round
    assert last.rows == rows[rounds] and program.ahead_adopted == rounds + 1
    program.commit(last.take(), [ACCEPT, ACCEPT])
    program.discard_ahead()
    for h, w in zip(hs, want):
        _assert_same(_committed(program, h), w)
    assert program.resource_usage() == usage
    program.check_invariants()


@pytest.mark.parametrize("rounds", [1, 2])
@pytest.mark.parametrize("rejected", [0, 1])
def test_a_rejected_row_discards_the_chained_step_first(rounds, rejected):
    """A cancelled row goes back to the state before its step (its own bank's backup, which the chained step did
    not overwrite), the other row keeps the state after it (the chained step's backup, restored first)."""
    before, _, _ = _sync_states(rounds - 1)
    after, _, _ = _sync_states(rounds)
    program, hs = _rows()
    batch = _adopt(program, hs, rounds)
    decisions = [ACCEPT, ACCEPT]
    decisions[rejected] = REJECT
    program.commit(batch.take(), decisions)
    assert program.ahead_handles() == ()
    for i, h in enumerate(hs):
        _assert_same(_committed(program, h), (before if i == rejected else after)[i])
    program.check_invariants()


def test_a_row_ending_discards_the_chained_step():
    """A terminal row (its release would discard the step anyway) ends the chained step at the commit; the other
    row keeps the state after its step."""
    after, _, usage = _sync_states(1)
    program, hs = _rows()
    batch = _adopt(program, hs, 1)
    program.commit(batch.take(), [RowDecision(1, True), ACCEPT])
    assert program.ahead_handles() == ()
    for h, w in zip(hs, after):
        _assert_same(_committed(program, h), w)
    assert program.resource_usage() == usage
    program.check_invariants()


@pytest.mark.parametrize("rounds", [1, 2])
def test_abort_pending_restores_the_rows_through_both_steps(rounds):
    before, _, usage = _sync_states(rounds - 1)
    program, hs = _rows()
    batch = _adopt(program, hs, rounds)
    program.abort_pending(batch.take())
    for h, w in zip(hs, before):
        _assert_same(_committed(program, h), w)
    assert program.resource_usage() == usage
    program.check_invariants()


@pytest.mark.parametrize("why", ["penalties", "no room"])
def test_rows_that_cannot_chain_run_their_rounds_unchained(why):
    """Penalties count each committed token before the next draw; a row whose budget ends with this step's draw
    ends at its commit (the 4-token prompt's: its page would still hold the next position)."""
    if why == "penalties":
        args = dict(max_new=12, sampling=SamplingParams(presence_penalty=0.5))
    else:
        args = dict(max_new=2, prompts=PROMPTS[:1])
    program, hs = _rows(**args)
    sync, shs = _rows(**args)
    assert program.launch_ahead(hs)
    batch = program.decode(hs)
    assert program.ahead_chained == 0 and batch.rows == sync.decode(shs).rows
    program.commit(batch.take(), [ACCEPT] * len(hs))
    assert program.ahead_handles() == ()
    program.check_invariants()
