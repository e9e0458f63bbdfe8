"""The Engine property harness: a Hypothesis state machine over random schedules, for any Program.

Rules submit requests (shared prefixes, session keys, deadlines, sampling, thinking budgets), cancel, abandon,
move the clock, advance the worker and inject Program faults. After every step it checks every component's
invariants and the request-level facts: exactly one terminal event per accepted request, events in order, no
output before GenerationStart, capacity accounting, and schedule invariance (a request with a fixed seed yields
the tokens of its solo run whatever the concurrency, chunking or cache hits). At teardown the Engine drains and
every page and slot not held by a published checkpoint is free again.

Use `make_engine_machine(program_factory)` and run the returned class with Hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ninfer.contracts import (FinishReason, GenerationResult, GenerationStart, OutputDelta, RequestRejected)
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine, GenerationHandle
from ninfer.engine.records import GenerationRequest
from ninfer.sampling import SamplingParams

from .faults import FAULTABLE, FaultyProgram
from .sessions import TokenSession

ProgramFactory = Callable[[], Any]

PREFIXES = ((3, 5, 7, 9, 11, 13, 15, 17), (2, 4, 6), (21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Tracked:
    handle: GenerationHandle
    request: GenerationRequest
    events: list
    abandoned: bool = False
    cancelled: bool = False


def _solo_tokens(factory: ProgramFactory, request: GenerationRequest, think_budget: int | None) -> tuple[int, ...]:
    """The oracle for schedule invariance: the same request alone, no prefix caching, one lane."""
    engine = Engine(factory(), EngineConfig(max_concurrency=1, prefix_caching=False), threaded=False)
    session = TokenSession(request.max_tokens, think_budget=think_budget)
    solo = GenerationRequest(request.prompt, session, request.max_tokens, request.sampling, request.seed)
    handle = engine.submit(solo)
    engine.run_until_idle()
    result = handle.result(timeout=0)
    assert result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), result
    return result.token_ids


class EngineMachine(RuleBasedStateMachine):
    """Subclassed by make_engine_machine with the Program factory, the lane count and whether faults run."""

    factory: ProgramFactory
    max_concurrency = 3
    faults = True

    @initialize(chunk=st.integers(1, 9), concurrent=st.booleans(),
                caching=st.sampled_from([True, True, True, False]), queue_bound=st.integers(0, 4),
                fault_run=st.booleans(), cache_cap=st.sampled_from([None, None, 1, 3]))
    def start(self, chunk, concurrent, caching, queue_bound, fault_run, cache_cap):
        self.fault_run = self.faults and fault_run
        self.clock = FakeClock()
        self.program = FaultyProgram(type(self).factory())
        self.config = EngineConfig(max_concurrency=self.max_concurrency, queue_bound=queue_bound, prefill_chunk=chunk,
                                   concurrent_prefill=concurrent, prefix_caching=caching, check_invariants=True,
                                   max_cached_checkpoints=cache_cap)
        self.engine = Engine(self.program, self.config, threaded=False, clock=self.clock)
        self.tracked: list[Tracked] = []
        self.solo_cache: dict[Any, tuple[int, ...]] = {}
        self.budgets: dict[int, int | None] = {}

    @rule(prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(1, 90), max_size=12),
          max_tokens=st.integers(1, 12), session=st.sampled_from([None, "a", "b"]),
          deadline=st.one_of(st.none(), st.floats(0.5, 20)), seed=st.one_of(st.none(), st.integers(0, 5)),
          think=st.one_of(st.none(), st.integers(1, 4)), timeout=st.one_of(st.none(), st.floats(0.5, 10)))
    def submit(self, prefix, suffix, max_tokens, session, deadline, seed, think, timeout):
        self._submit(prefix + tuple(suffix), max_tokens, session, deadline, seed, think, timeout)

    @precondition(lambda self: any(t.events and isinstance(t.events[-1], GenerationResult) for t in self.tracked))
    @rule(data=st.data(), suffix=st.lists(st.integers(1, 90), min_size=1, max_size=8),
          max_tokens=st.integers(1, 12), seed=st.one_of(st.none(), st.integers(0, 5)))
    def submit_next_turn(self, data, suffix, max_tokens, seed):
        """A conversation's next turn: the previous prompt and output, then new tokens, same session key."""
        done = [t for t in self.tracked if t.events and isinstance(t.events[-1], GenerationResult)]
        prev = data.draw(st.sampled_from(done))
        prompt = prev.request.prompt + prev.events[-1].token_ids + tuple(suffix)
        self._submit(prompt, max_tokens, prev.request.session_key, None, seed, None, None)

    def _submit(self, prompt, max_tokens, session_key, deadline, seed, think, timeout):
        out = TokenSession(max_tokens, think_budget=think, commit_guard=self.program.check_no_pending_batch)
        req = GenerationRequest(prompt, out, max_tokens, sampling=None if seed is None else SamplingParams(temperature=0.7),
                                seed=seed if seed is not None else 0, session_key=session_key,
                                deadline=None if deadline is None else self.clock.now + deadline,
                                queue_timeout=timeout)
        try:
            handle = self.engine.submit(req)
        except RequestRejected:
            ok = (not self.engine.available or self.engine.outstanding >= self.config.max_outstanding
                  or len(prompt) + max_tokens > self.program.limits.max_context)
            assert ok, "a request was rejected without cause"
            return
        self.tracked.append(Tracked(handle, req, []))
        self.budgets[handle.request_id] = think

    @precondition(lambda self: self.tracked)
    @rule(data=st.data(), abandon=st.booleans())
    def cancel(self, data, abandon):
        t = data.draw(st.sampled_from(self.tracked))
        if abandon:
            t.abandoned = True
            t.handle.close()
        else:
            t.cancelled = True
            t.handle.cancel()

    @rule(n=st.integers(1, 6))
    def advance_worker(self, n):
        for _ in range(n):
            self.engine.step()

    @rule()
    def run_until_idle(self):
        """Let everything submitted so far finish, so later submissions meet published checkpoints."""
        for _ in range(2_000):
            if not self.engine.step():
                break

    @rule(dt=st.floats(0.1, 5.0))
    def advance_clock(self, dt):
        self.clock.now += dt

    @precondition(lambda self: self.fault_run and not self.program.fired)
    @rule(method=st.sampled_from(FAULTABLE), after=st.integers(0, 6))
    def inject_fault(self, method, after):
        self.program.arm(method, after)

    def _collect(self) -> None:
        for t in self.tracked:
            if t.abandoned:
                continue
            while not t.events or not isinstance(t.events[-1], GenerationResult):
                try:
                    t.events.append(t.handle._rec.events.get_nowait())
                except Exception:  # noqa: BLE001 - queue.Empty: nothing more yet
                    break

    @invariant()
    def events_are_well_formed(self):
        if not hasattr(self, "tracked"):
            return
        self._collect()
        for t in self.tracked:
            kinds = [type(e) for e in t.events]
            assert kinds.count(GenerationResult) <= 1, "more than one terminal event"
            if GenerationResult in kinds:
                assert kinds[-1] is GenerationResult, "events after the terminal one"
            if OutputDelta in kinds:
                assert kinds[0] is GenerationStart, "output before GenerationStart"
                streamed = tuple(x for e in t.events if isinstance(e, OutputDelta) for x in e.token_ids)
                if kinds[-1] is GenerationResult:
                    assert streamed == t.events[-1].token_ids, "streamed tokens differ from the result"

    @invariant()
    def engine_fails_only_from_injected_faults(self):
        """An invariant violation inside the worker fails the Engine; only an injected fault may do that."""
        if hasattr(self, "engine") and not self.engine.available:
            failure = self.engine.failure or ""
            assert failure.startswith("InjectedFault"), f"engine failed without an injected fault: {failure}"

    @invariant()
    def capacity_is_accounted(self):
        if not hasattr(self, "engine"):
            return
        live = sum(1 for t in self.tracked if not t.handle._rec.capacity_released)
        assert self.engine.outstanding == live, f"outstanding {self.engine.outstanding} != {live}"
        assert self.engine.outstanding <= self.config.max_outstanding

    def teardown(self):
        if not hasattr(self, "engine"):
            return
        self.program._armed = None
        for _ in range(10_000):
            if not self.engine.step() and not self.engine.core.records and not self.engine.core.inbox:
                break
        self._collect()
        for t in self.tracked:
            if not t.abandoned:
                assert t.events and isinstance(t.events[-1], GenerationResult), "request never finished"
                t.handle._done = True
                self.engine._consumer_released(t.handle._rec)
                self._check_schedule_invariance(t)
        assert self.engine.outstanding == 0, "capacity not released after drain"
        event(f"engine failed: {not self.engine.available}")
        if self.engine.available:
            usage = self.program.inner.resource_usage()
            assert usage.active_sequences == 0 and usage.reserved_pages == 0 and usage.sequence_pages == 0, usage
            assert usage.free_pages + usage.checkpoint_pages == usage.total_pages, usage
            self.engine.core.check_invariants()

    def _check_schedule_invariance(self, t: Tracked):
        result = t.events[-1]
        event(f"finish: {result.finish_reason.value}")
        if result.usage.cached_prompt_tokens:
            event("prefix cache hit")
        if any(len(e.token_ids) > 1 for e in t.events if isinstance(e, OutputDelta)):
            event("multi-token commit")
        if result.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH) or result.error:
            return
        think = self.budgets.get(t.handle.request_id)
        key = (t.request.prompt, t.request.max_tokens, t.request.seed, t.request.sampling, think)
        if key not in self.solo_cache:
            self.solo_cache[key] = _solo_tokens(type(self).factory, t.request, think)
        assert result.token_ids == self.solo_cache[key], "output depends on the schedule"


def make_engine_machine(factory: ProgramFactory, *, max_concurrency: int = 3, faults: bool = True):
    """The Engine state machine over Programs made by `factory` (one fresh Program per example)."""
    return type("EngineMachine", (EngineMachine,), {"factory": staticmethod(factory),
                                                     "max_concurrency": max_concurrency, "faults": faults})
