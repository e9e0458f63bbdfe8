"""The Engine's terminal paths by the seed: deadline and cancellation with the real OutputSession, the failure
cleanup order, submissions racing a failure, shutdown(timeout), the commit order of a terminal row, and a
post-start shortfall that fails the Engine instead of rejecting the request."""

import queue
import threading
import time

import pytest

from ninfer.contracts import (EngineFailure, FinishReason, GenerationResult, OutputDelta, RejectReason,
                              RequestRejected, ResourceResult)
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.records import GenerationRequest
from ninfer.frontend.outputs import OutputOptions
from ninfer.frontend.session import OutputSession
from ninfer.testing import toy_transitions
from ninfer.testing.faults import FaultyProgram
from ninfer.testing.sessions import TokenSession, token_request as request
from ninfer.testing.toy_program import ToyProgram


def _real_request(frontend, prompt, max_tokens, **kw):
    session = OutputSession(OutputOptions(max_tokens=max_tokens, stop_token_ids=()), frontend.table,
                            reasoning_open=False)
    return GenerationRequest(tuple(prompt), session, max_tokens, **kw)


@pytest.mark.parametrize("how", ["deadline", "cancel"])
def test_active_request_ended_early_keeps_its_output_with_the_real_session(make_engine, clock, frontend, how):
    eng, prog = make_engine(max_concurrency=1)
    h = eng.submit(_real_request(frontend, range(40, 50), 60, deadline=clock.now + 5))
    for _ in range(6):
        eng.step()
    assert eng.core.records[h.request_id].output_tokens, "expected some output before the deadline"
    if how == "deadline":
        clock.now += 10
    else:
        h.cancel()
    eng.run_until_idle()
    events = list(h.events(timeout=0))
    result = events[-1]
    assert isinstance(result, GenerationResult)
    assert result.finish_reason is (FinishReason.DEADLINE if how == "deadline" else FinishReason.CANCELLED)
    if how == "deadline":
        assert result.error is None
    assert result.token_ids and result.usage.completion_tokens == len(result.token_ids)
    assert result.output is not None and result.output.token_ids == result.token_ids
    assert result.output.finish_reason is result.finish_reason
    streamed = "".join(e.delta.text for e in events if isinstance(e, OutputDelta))
    assert streamed == result.output.content
    assert prog.resource_usage().active_sequences == 0 and eng.outstanding == 0


class _Recording:
    """A Program proxy that logs every mutating call, to check the failure cleanup order."""

    def __init__(self, inner, log):
        self._inner, self._log = inner, log
        self.limits = inner.limits

    @property
    def resource_revision(self):
        return self._inner.resource_revision

    def __getattr__(self, name):
        target = getattr(self._inner, name)
        if name not in ("plan", "start", "advance", "abort", "commit", "abort_pending"):
            return target

        def call(*args, **kw):
            kind = getattr(getattr(args[0], "kind", None), "value", "") if name == "plan" else ""
            self._log.append(f"{name}:{kind}" if kind else name)
            return target(*args, **kw)
        return call


class _FailingPreview(TokenSession):
    """Breaks the contract (an EngineFailure in preview) once `when()` holds, with a PendingBatch unconsumed."""

    def __init__(self, max_tokens, when):
        super().__init__(max_tokens, stop_ids=())
        self.when = when

    def preview(self, tokens, *, forced=False):
        if self.when():
            raise EngineFailure("planted: the session saw a token its grammar forbids")
        return super().preview(tokens, forced=forced)


def test_failure_cleanup_aborts_transactions_then_releases_then_clears_then_completes(make_engine):
    log: list[str] = []
    prog = _Recording(ToyProgram(max_concurrency=2), log)
    eng, _ = make_engine(program=prog, max_concurrency=2, prefill_chunk=64)
    warm = eng.submit(request(range(1, 20), 2))
    eng.run_until_idle()
    warm.result(timeout=0)
    core = eng.core
    a = eng.submit(GenerationRequest(tuple(range(60, 66)), _FailingPreview(40, lambda: core.txn is not None), 40))
    for _ in range(4):
        eng.step()
    # b materializes from the warm checkpoint in two stages: its transition is open while a's decode previews
    b = eng.submit(request(tuple(range(1, 20)) + (5, 5), 4))
    orig_finish = core.on_finish

    def on_finish(rec):
        cleared = not core.resources.catalog and all(o is None for o in core.resources.lane_owner)
        log.append(f"result:{'cleared' if cleared else 'not cleared'}")
        orig_finish(rec)
    core.on_finish = on_finish
    del log[:]
    eng.run_until_idle()
    assert not eng.available and "planted" in eng.failure
    first_result = min(i for i, e in enumerate(log) if e.startswith("result"))
    assert "abort" in log and "abort_pending" in log, log
    release = log.index("plan:release")
    assert log.index("abort") < release and log.index("abort_pending") < release, log
    assert release < first_result and all(e == "result:cleared" for e in log[first_result:]), log
    for h in (a, b):
        assert h.result(timeout=0).finish_reason is FinishReason.ERROR
    usage = prog.resource_usage()
    assert usage.active_sequences == 0 and usage.reserved_pages == 0, usage
    assert core.resources.lanes == [core.resources.lanes[0].__class__.FREE] * 2
    assert eng.outstanding == 0


class _FailOnClock:
    """A clock whose call inside submit fails the Engine first: the failure lands between submit's checks and
    its hand-off to the worker, the narrowest interleaving of the race."""

    def __init__(self):
        self.now, self.armed, self.engine = 1000.0, False, None

    def __call__(self):
        if self.armed:
            self.armed = False
            self.engine.core.program.arm("decode", 0)
            for _ in range(20):
                self.engine.step()
            assert not self.engine.available
        return self.now


def test_submission_racing_a_failure_is_rejected():
    """The failure lands after submit's checks, before the inbox takes the request: the inbox is closed by then,
    so the request is refused rather than accepted without a terminal event. (A racing submission the inbox took
    first ends with ERROR: test_threaded_submissions_during_a_failure_each_get_one_terminal_event.)"""
    clock = _FailOnClock()
    prog = FaultyProgram(ToyProgram(max_concurrency=2))
    eng = Engine(prog, EngineConfig(max_concurrency=2, check_invariants=True), threaded=False, clock=clock)
    clock.engine = eng
    first = eng.submit(request(range(1, 9), 20))
    eng.step()
    clock.armed = True
    with pytest.raises(RequestRejected) as e:
        eng.submit(request(range(1, 5), 3))
    assert e.value.reason is RejectReason.ENGINE_UNAVAILABLE and not clock.armed  # the failure ran inside submit
    assert first.result(timeout=0).finish_reason is FinishReason.ERROR
    assert eng.outstanding == 0


@pytest.mark.parametrize("round_", range(4))
def test_threaded_submissions_during_a_failure_each_get_one_terminal_event(round_):
    prog = FaultyProgram(ToyProgram(max_concurrency=4))
    eng = Engine(prog, EngineConfig(max_concurrency=4, queue_bound=200))
    accepted, refused, go = [], [], threading.Event()

    def submitter(i):
        # paced, and on until the Engine refuses: the submissions span the failure (unpaced, all 60 of them
        # were in before the worker's first decode, so none met the failure)
        go.wait()
        for j in range(2000):
            time.sleep(0.001)
            try:
                accepted.append(eng.submit(request(range(1, 4 + (i + j) % 7), 30)))
            except RequestRejected as e:
                assert e.reason is RejectReason.ENGINE_UNAVAILABLE
                refused.append(i)
                return

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    prog.arm("decode", 3 + round_)
    go.set()
    for t in threads:
        t.join(timeout=20)
    results = [h.result(timeout=10) for h in accepted]
    assert not eng.available
    assert accepted and sorted(refused) == [0, 1, 2, 3], (len(accepted), refused)
    assert all(isinstance(r, GenerationResult) for r in results)
    for h in accepted:
        assert h._rec.events.empty(), "an event after the terminal one"
    assert eng.outstanding == 0
    eng.shutdown()


class _SlowToy(ToyProgram):
    def decode(self, handles, masks=None, prefill=None):
        threading.Event().wait(0.002)  # long enough that a threaded worker is still decoding at shutdown
        return super().decode(handles, masks, prefill)


@pytest.mark.parametrize("threaded", [False, True])
def test_shutdown_cancels_in_flight_requests_and_each_gets_its_result(threaded):
    prog = _SlowToy(max_concurrency=2)
    eng = Engine(prog, EngineConfig(max_concurrency=2, queue_bound=4), threaded=threaded)
    handles = [eng.submit(request(range(1, 8 + i), 200)) for i in range(4)]
    if not threaded:
        for _ in range(5):
            eng.step()
    eng.shutdown(timeout=0)
    results = [h.result(timeout=5) for h in handles]
    assert all(r.finish_reason in (FinishReason.CANCELLED, FinishReason.STOP, FinishReason.LENGTH) for r in results)
    assert any(r.finish_reason is FinishReason.CANCELLED for r in results)
    assert prog.resource_usage().active_sequences == 0 and eng.outstanding == 0
    with pytest.raises(RequestRejected) as e:
        eng.submit(request([1, 2], 2))
    assert e.value.reason is RejectReason.ENGINE_UNAVAILABLE


def test_shutdown_lets_in_flight_requests_finish_within_the_timeout():
    eng = Engine(ToyProgram(max_concurrency=2), EngineConfig(max_concurrency=2))
    handles = [eng.submit(request(range(1, 8 + i), 6)) for i in range(3)]
    eng.shutdown(timeout=30)
    for h in handles:
        assert h.result(timeout=0).finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert eng.outstanding == 0 and not eng.available


class _OrderCheckingSession(TokenSession):
    """Checks the seed's commit order from the session's side: scheduler accounting before the session commit,
    and a terminal row's commit only after the Program settled the sequence (retain or release adopted)."""

    def __init__(self, max_tokens, engine, program):
        super().__init__(max_tokens)
        self.engine, self.program, self.rid = engine, program, None

    def commit(self, preview):
        rec = self.engine.core.records[self.rid]
        sched = self.engine.core.scheduler
        if preview.terminal:
            assert rec.handle is None and rec.lane is None, "terminal output committed before its resource result"
            assert all(s.handle != rec.handle for s in self.program.seqs.values())
        else:
            assert self.rid in sched.decode_ready or self.rid in sched.control_ready, \
                "OutputSession committed before scheduler accounting"
        return super().commit(preview)


class _CheckingEvents(queue.SimpleQueue):
    def __init__(self, rec):
        super().__init__()
        self.rec = rec

    def put(self, item, block=True, timeout=None):
        if isinstance(item, OutputDelta) and self.rec.request.session.finish is not None:
            assert self.rec.handle is None, "final delta published before the terminal result was adopted"
        super().put(item, block, timeout)


def test_terminal_row_is_published_after_its_resource_result(make_engine):
    eng, prog = make_engine(max_concurrency=2, prefill_chunk=3)
    handles = []
    for i in range(3):
        session = _OrderCheckingSession(4 + i, eng, prog)
        h = eng.submit(GenerationRequest(tuple(range(1, 9 + i)), session, 4 + i, session_key="s" if i else None))
        session.rid = h.request_id
        h._rec.events = _CheckingEvents(h._rec)
        handles.append(h)
    eng.run_until_idle()
    assert eng.available, eng.failure
    for h in handles:
        r = h.result(timeout=0)
        assert r.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and r.token_ids


def test_a_shortfall_after_the_plan_was_sealed_fails_the_engine(make_engine, monkeypatch):
    def short(prog, txn, choice):
        return ResourceResult(txn.txn_id, choice.kind, False, prog._revision, detail="pools changed under the plan")

    monkeypatch.setattr(toy_transitions, "_materialize", short)
    eng, _ = make_engine()
    h = eng.submit(request(range(1, 9), 4))
    eng.run_until_idle()
    assert not eng.available and "materialization" in eng.failure
    assert h.result(timeout=0).finish_reason is FinishReason.ERROR
