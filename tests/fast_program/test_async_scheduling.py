"""Async scheduling on the fast Program (naive kernels on CPU, Triton and CUDA graphs on the GPU): the planted
bugs the property harness must catch, each breaking one rule of docs/engine.md "Async scheduling", and direct
checks of the launched step's adoption and rollback.

The machine is test_properties.py's `Async` (two lanes, tight pools, masked rows, cancellations, deadlines,
faults; `AsyncSpeculative` with MTP rounds launched ahead); the hunt is derandomized so each mutant meets the same
schedules."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from ninfer.contracts import EngineFailure, OutputDelta, ResourceChoice, RowDecision, TransitionKind
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.records import GenerationRequest
from ninfer.engine.units import UnitRunner
from ninfer.program_core import ahead as ahead_step
from ninfer.sampling import SamplingParams
from ninfer.testing.harness import make_engine_machine
from ninfer.testing.hunts import fixed_constants
from ninfer.testing.protocol_driving import finish
from ninfer.testing.sessions import TokenSession
from ninfer.testing.siblings import sibling
from ninfer.testing.spec_driving import start_decoding


def _props():
    return sibling(__file__, "test_properties.py")


HUNT = settings(max_examples=150, stateful_step_count=30, deadline=None, database=None, derandomize=True,
                phases=[Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)


def discard_keeps_the_step(prog, ahead):
    """The launched step is dropped without restoring the rows' committed GDN state (pages still go back)."""
    for h, prov in zip(ahead.handles, ahead.provisional):
        seq = prog.sequence(h)
        for p in reversed(prov.grown):
            seq.table.pop()
            prog.alloc.unref(p)
            seq.reserve_left += 1


def discard_forgets_the_rider(prog, ahead):
    """A discarded round restores its rows but leaves a riding chunk's sequence as the launch left it (its state
    advanced, its pages still taken)."""
    for h, prov in zip(ahead.handles, ahead.provisional):
        ahead_step.restore(prog, prog.sequence(h), prov)


_end_cancelled = UnitRunner.end_cancelled


def publish_ahead_token_of_cancelled(self, cancelled):
    """A cancelled row's launched-ahead token is published as if it had been committed."""
    inner = getattr(self.core.program, "inner", self.core.program)
    launched = inner._ahead
    batch = None
    for rid in sorted(cancelled):
        rec = self.core.records.get(rid)
        if launched is not None and rec is not None and rec.handle in launched.handles:
            batch = batch or launched.started.finish()
            row = batch.rows[launched.handles.index(rec.handle)]
            if row.failure is None:
                rec.events.put(OutputDelta(rid, row.tokens, row.tokens))
    return _end_cancelled(self, cancelled)


def matches_ignoring_masks(launched, handles, masks, chunk=None):
    """A masked round adopts the step that was launched unmasked."""
    return tuple(handles) == launched.handles and chunk == launched.chunk


_launch = ahead_step.launch


def launch_at_stale_frontier(prog, handles, *chunk):
    """The step is launched one position short, from the rows as they were before the commit moved the frontier
    (the last consumed token pending again). The frontier is len(tokens): it moves only with them."""
    seqs = [prog.sequence(h) for h in handles]
    moved = [(s.tokens.pop(), s.pending) for s in seqs]
    for s, (last, _) in zip(seqs, moved):
        s.pending = last
    try:
        return _launch(prog, handles, *chunk)
    finally:
        for s, (last, pending) in zip(seqs, moved):
            s.tokens.append(last)
            s.pending = pending


MUTANTS = {
    "discard_keeps_the_step": ((ahead_step, "discard", discard_keeps_the_step), ("output depends on the schedule",)),
    "matches_ignoring_masks": ((ahead_step, "matches", matches_ignoring_masks), ("output depends on the schedule",)),
    "discard_forgets_the_rider": ((ahead_step, "discard", discard_forgets_the_rider),
                                  ("output depends on the schedule", "does not cover")),
    # not "engine failed" alone: a mutant that raises by itself would match it
    "launch_at_stale_frontier": ((ahead_step, "launch", launch_at_stale_frontier),
                                 ("output depends on the schedule", "does not cover")),
}


@functools.cache
def _unmasked():
    """Without masked rows or faults more rounds are launched ahead."""
    return make_engine_machine(_props()._program, max_concurrency=2, faults=False, async_scheduling=True)


@functools.cache
def _stopping():
    """Every fourth token id stops a request: requests end mid-stream beside rows that go on, so steps chained
    behind an adopted round are discarded by its commit (`ninfer/program_core/chain.py`)."""
    vocab = _props()._conftest()[1].vocab_size
    return make_engine_machine(_props()._program, max_concurrency=2, faults=False, async_scheduling=True,
                               stop_ids=tuple(range(0, vocab, 4)))


def _on_gpu() -> bool:
    return _props()._conftest()[0].ON_GPU


# the planted bugs test the harness, which is the same on the GPU; there each example also captures CUDA graphs
@pytest.mark.skipif("_on_gpu()", reason="the harness's own check: runs on the CPU (150 Program builds per hunt)")
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_harness_catches_async_mutant(name, monkeypatch):
    (owner, attr, bug), symptoms = MUTANTS[name]
    monkeypatch.setattr(owner, attr, bug)
    with pytest.raises(Exception) as caught, fixed_constants():  # noqa: PT011 - any failure, checked by its message
        run_state_machine_as_test(_props().Async, settings=HUNT)
    assert any(s in str(caught.value) for s in symptoms), f"{name}: caught for another reason: " \
                                                         f"{type(caught.value).__name__}: {str(caught.value)[:400]}"


@pytest.mark.skipif("_on_gpu()", reason="the harness's own check: runs on the CPU")
def test_harness_catches_a_speculative_round_discarded_without_its_restore(monkeypatch):
    # whole MTP rounds launched ahead: a discard that keeps the round's stepped state must show
    monkeypatch.setattr(ahead_step, "discard", discard_keeps_the_step)
    with pytest.raises(Exception) as caught, fixed_constants():  # noqa: PT011 - any failure, checked by its message
        run_state_machine_as_test(_props().AsyncSpeculative, settings=HUNT)
    assert "output depends on the schedule" in str(caught.value), str(caught.value)[:400]


@pytest.mark.parametrize("machine", ["masked", "unmasked", "stopping"])
def test_the_unmutated_hunt_passes(machine):
    examples = 8 if _on_gpu() else 40
    made = {"masked": lambda: _props().Async, "unmasked": _unmasked, "stopping": _stopping}[machine]()
    with fixed_constants():
        run_state_machine_as_test(made, settings=settings(HUNT, max_examples=examples))


def _run(async_scheduling: bool, prompts, max_tokens=9, make=lambda: _props()._program()):
    program = make()
    engine = Engine(program, EngineConfig(max_concurrency=2, prefix_caching=False, check_invariants=True,
                                          async_scheduling=async_scheduling), threaded=False)
    handles = [engine.submit(GenerationRequest(p, TokenSession(max_tokens, stop_ids=()), max_tokens))
               for p in prompts]
    engine.run_until_idle()
    return [h.result(timeout=0).token_ids for h in handles], program


def test_launched_rounds_are_adopted_and_equal_the_synchronous_run():
    prompts = [(3, 5, 7, 9), (2, 4, 6, 8, 10, 12)]
    sync, sync_program = _run(False, prompts)
    overlapped, program = _run(True, prompts)
    assert overlapped == sync and all(len(t) == 9 for t in sync)
    assert sync_program.ahead_launched == 0
    # both rows decode together for 8 rounds; every round but the last (a row ends) is launched ahead: the first
    # after its commit, each later one chained behind the round before it as that one was adopted; the round that
    # draws the rows' last tokens (max_tokens) chains nothing, so every step launched or chained is adopted
    assert program.ahead_adopted >= 6 and program.ahead_launched == program.ahead_adopted
    assert program.ahead_chained == program.ahead_adopted - 1
    assert program.resource_usage().active_sequences == 0 and program.ahead_handles() == ()


def test_a_discarded_step_restores_the_committed_state():
    program = _props()._program()
    engine = Engine(program, EngineConfig(max_concurrency=2, prefix_caching=False, check_invariants=True,
                                          async_scheduling=True), threaded=False)
    first = engine.submit(GenerationRequest((3, 5, 7, 9), TokenSession(12, stop_ids=()), 12))
    for _ in range(200):
        engine.step()
        if program.ahead_handles():
            break
    assert program.ahead_handles(), "no step was launched ahead"
    # a new request: its admission's transition rolls the launched step back before anything else runs
    second = engine.submit(GenerationRequest((2, 4, 6), TokenSession(5, stop_ids=()), 5))
    engine.step()
    assert program.ahead_launched > program.ahead_adopted  # rolled back; check_invariants held at each boundary
    engine.run_until_idle()
    alone, _ = _run(False, [(3, 5, 7, 9)], max_tokens=12)
    assert first.result(timeout=0).token_ids == alone[0]
    assert len(second.result(timeout=0).token_ids) == 5


_BACKENDS = {"mtp": lambda: _props()._speculative(), "dflash2": lambda: _props()._dflash("dflash2", 7, 12, True)}


@pytest.mark.parametrize("backend", sorted(_BACKENDS))
def test_speculative_rounds_launched_ahead_equal_the_synchronous_run(backend):
    # MTP k = 3 and DFlash2 block 8 with ForcedDrafts (random acceptance lengths): each round after a commit is
    # launched ahead whole (draft, verify, device acceptance and its copy queued) and adopted by the next decode
    prompts = [(3, 5, 7, 9), (2, 4, 6, 8, 10, 12)]
    sync, sync_program = _run(False, prompts, 11, _BACKENDS[backend])
    overlapped, program = _run(True, prompts, 11, _BACKENDS[backend])
    assert overlapped == sync and all(len(t) == 11 for t in sync)
    assert sync_program.ahead_launched == 0
    assert program.ahead_adopted >= 2 and program.ahead_launched == program.ahead_adopted
    assert program.resource_usage().active_sequences == 0 and program.ahead_handles() == ()
    alone, _ = _run(False, prompts, max_tokens=11)  # the plain Program's greedy output
    assert overlapped == alone


@pytest.mark.parametrize("planted", [False, True])
def test_a_row_cancelled_with_a_step_in_flight_publishes_only_committed_tokens(planted, monkeypatch):
    """A cancellation that meets a launched round, every time (the random hunt meets one too rarely to hunt the
    planted bug reliably): with `publish_ahead_token_of_cancelled` planted the launched token reaches the stream."""
    if planted:
        monkeypatch.setattr(UnitRunner, "end_cancelled", publish_ahead_token_of_cancelled)
        with pytest.raises(AssertionError, match="cancelled"):
            _cancel_with_a_round_in_flight()
    else:
        _cancel_with_a_round_in_flight()


def _cancel_with_a_round_in_flight():
    program = _props()._program()
    engine = Engine(program, EngineConfig(max_concurrency=2, prefix_caching=False, check_invariants=True,
                                          async_scheduling=True), threaded=False)
    sessions = [TokenSession(10, stop_ids=()), TokenSession(10, stop_ids=())]
    kept, cancelled = (engine.submit(GenerationRequest(p, s, 10)) for p, s in zip([(3, 5, 7), (2, 4, 6, 8)], sessions))
    for _ in range(200):
        engine.step()
        if len(program.ahead_handles()) == 2:
            break
    assert len(program.ahead_handles()) == 2, "no round was launched ahead"
    cancelled.cancel()
    engine.run_until_idle()
    events = list(cancelled.events())
    result = events[-1]
    streamed = tuple(t for e in events if isinstance(e, OutputDelta) for t in e.token_ids)
    assert result.finish_reason.value == "cancelled" and streamed == result.token_ids == tuple(sessions[1].tokens)
    assert len(result.token_ids) < 10
    alone, _ = _run(False, [(3, 5, 7)], max_tokens=10)
    assert kept.result(timeout=0).token_ids == alone[0]


def test_penalties_bias_min_tokens_and_logprobs_overlap_exactly():
    """Rows whose draws read the device's per-sequence tables (output counts, bias, min_tokens) and ask for
    logprobs: the launched round samples after the commit updated the counts, so it equals the synchronous run."""
    params = [SamplingParams(temperature=0.9, presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=1.3,
                             logit_bias=((5, 3.0), (7, -2.0)), logprobs=2),
              SamplingParams(temperature=0.0, min_tokens=6, logprobs=0)]

    def run(overlap: bool):
        program = _props()._program()
        engine = Engine(program, EngineConfig(max_concurrency=2, prefix_caching=False, check_invariants=True,
                                              async_scheduling=overlap), threaded=False)
        handles = [engine.submit(GenerationRequest(p, TokenSession(10, stop_ids=(0,), min_tokens=q.min_tokens), 10,
                                                   sampling=q, seed=3 + i))
                   for i, (p, q) in enumerate(zip([(3, 5, 7, 9), (2, 4, 6, 8, 10)], params))]
        engine.run_until_idle()
        out = []
        for h in handles:
            events = list(h.events())
            lps = [lp for e in events if isinstance(e, OutputDelta) and e.logprobs for lp in e.logprobs]
            out.append((events[-1].token_ids, lps))
        return out, program

    sync, _ = run(False)
    overlapped, program = run(True)
    assert overlapped == sync and program.ahead_adopted > 0


def _two_rows():
    """A fast Program with two greedy rows past their prompts, whose next tokens differ."""
    program = _props()._program()
    return program, [start_decoding(program, p, 12) for p in [(3, 5, 7, 9), (2, 4, 6, 8, 10)]]


def test_a_decode_of_the_rows_in_another_order_is_not_the_launched_step():
    """The launched draws are in the launched rows' order: a decode naming the rows in another order rolls the step
    back and runs its own (adopting it would hand each row the other's draw)."""
    sync, hs = _two_rows()
    want = sync.decode(hs[::-1]).rows
    assert want[0].tokens != want[1].tokens
    program, hs = _two_rows()
    assert program.launch_ahead(hs)
    batch = program.decode(hs[::-1])
    assert batch.rows == want and program.ahead_adopted == 0
    program.abort_pending(batch.take())
    program.check_invariants()


def test_forced_tokens_for_a_launched_row_start_from_its_committed_state():
    """`control` of a row with a step in flight (a session forcing tokens at the boundary the step was launched
    across) first rolls the step back: its backup and its feed start from the committed state and frontier."""
    forced = (11, 13, 17)
    runs = []
    for launched in (False, True):
        program, hs = _two_rows()
        if launched:
            assert program.launch_ahead(hs)
        batch = program.control(hs[0], forced)
        program.commit(batch.take(), [RowDecision(len(forced), False)])
        program.check_invariants()
        runs.append(program.decode(hs).rows)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("retain", [False, True])
def test_ending_a_launched_row_rolls_the_step_back_first(retain):
    """A transition that ends a row of the launched step (a release, or a retain whose checkpoint is the live state)
    first rolls the step back: the row's slot and pages are its committed ones when they change owner, and the
    other row's next decode equals the run where nothing was launched."""
    runs = []
    for launched in (False, True):
        program, hs = _two_rows()
        if launched:
            assert program.launch_ahead(hs)
        frontier = program.sequence(hs[0]).frontier
        finish(program, hs[0], retain_at=frontier if retain else None)
        program.check_invariants()
        batch = program.decode(hs[1:])
        runs.append((batch.rows, program.resource_usage()))
        program.abort_pending(batch.take())
        program.check_invariants()
    assert runs[0] == runs[1]


def test_a_launch_for_a_row_inside_its_prompt_is_refused_untouched():
    """Only rows past their prompt can step: a launch naming a row mid-prefill is an EngineFailure before any page
    is taken or any step queued."""
    program = _props()._program()
    h = start_decoding(program, (3, 5, 7, 9), 12)
    txn = program.start(program.plan(ResourceChoice(TransitionKind.MATERIALIZE, prompt=(5, 6, 7, 8, 9, 10),
                                                    max_new_tokens=4)))
    mid = program.advance(txn).handle
    assert program.prefill(mid, 3) is None
    before = program.resource_usage()
    with pytest.raises(EngineFailure, match="past their prompt"):
        program.launch_ahead([h, mid])
    assert program.ahead_handles() == () and program.resource_usage() == before
    program.check_invariants()
