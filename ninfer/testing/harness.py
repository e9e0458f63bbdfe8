"""The Engine property harness: a Hypothesis state machine over random schedules, for any Program.

Rules submit requests (shared prefixes, session keys, deadlines, queue timeouts, sampling, thinking budgets),
cancel, abandon, consume results, move the clock, advance the worker and inject Program faults (raised before a
call, raised after the Program mutated, or a corrupted return value). Every check compares the Engine against
the harness's own model (`request_model.RequestModel`), never against the Engine's counters:

- each request's events, stamped with the boundary that published them (`tracking.Stamped`): exactly one terminal event,
  GenerationStart before output, streamed tokens equal to the result; a delta published only after the session
  committed it, a terminal output and the result only after the Program settled the sequence; a request that did
  not succeed is never retained;
- capacity against the release rule (`response_done && consumer_released`, once): the result was published and
  the harness consumed it or abandoned the handle; a rejection for overload must be explained by that model;
- the Program calls, boundary by boundary (`watch.ProgramWatch`): worker-boundary order, the cancellation
  snapshot, abort of a cancelled materialization, exact decode rounds (each ready sequence once), decode not
  starved, the FIFO head, no commit accepting more tokens than its row produced;
- SessionIndex: a binding is replaced only by a request submitted later;
- failure: only an injected fault fails the Engine; a raised fault fails it with InjectedFault, a corrupted value
  with a typed EngineFailure in the very step it was returned; every PendingBatch is consumed by then;
- at teardown: drain, schedule invariance against a solo run, and every page and slot not held by a checkpoint
  free again.

Use `make_engine_machine(program_factory)` and run the returned class with Hypothesis.
"""

from __future__ import annotations

from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ninfer.contracts import FinishReason, GenerationResult, GenerationStart, OutputDelta, RequestRejected
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.records import GenerationRequest
from ninfer.sampling import SamplingParams

from .faults import FAULTABLE, MODES, FaultyProgram
from .request_model import RequestModel
from .sessions import AlternateMask, TokenSession
from .tracking import FakeClock, ProgramFactory, Stamped, Tracked, solo_tokens

__all__ = ["EngineMachine", "FakeClock", "make_engine_machine"]

PREFIXES = ((3, 5, 7, 9, 11, 13, 15, 17), (2, 4, 6), (21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33))
STEPS = [0]  # Engine boundaries run by every machine in this process (the soak run reports it)


class EngineMachine(RuleBasedStateMachine):
    """Subclassed by make_engine_machine with the Program factory, the lane count and whether faults run."""

    factory: ProgramFactory
    oracle: ProgramFactory | None = None  # greedy requests' solo runs, when not `factory` (a Program without MTP)
    max_concurrency = 3
    faults = True
    fault_methods: tuple[str, ...] = FAULTABLE
    fault_modes: tuple[str, ...] = MODES
    fault_variants: tuple[int, ...] = (0, 1, 2, 3, 4)
    session_keys: tuple[str | None, ...] = (None, "a", "b")
    async_scheduling = False  # launch decode rounds ahead (docs/engine.md "Async scheduling")
    grammar_rows = False  # some requests constrain every other output token (`AlternateMask`)
    stop_ids: tuple[int, ...] = (0,)  # every request's stop tokens

    @initialize(chunk=st.integers(1, 9), concurrent=st.booleans(),
                caching=st.sampled_from([True, True, True, False]), queue_bound=st.integers(0, 4),
                fault_run=st.booleans(), cache_cap=st.sampled_from([None, None, 1, 3]))
    def start(self, chunk, concurrent, caching, queue_bound, fault_run, cache_cap):
        self.fault_run = self.faults and fault_run
        self.clock = FakeClock()
        self.model = RequestModel(self.clock, engine_ok=lambda: self.engine.core.failed is None)
        self.watch = self.model.watch
        self.program = FaultyProgram(type(self).factory(), self.watch)
        self.config = EngineConfig(max_concurrency=self.max_concurrency, queue_bound=queue_bound, prefill_chunk=chunk,
                                   concurrent_prefill=concurrent, prefix_caching=caching, check_invariants=True,
                                   max_cached_checkpoints=cache_cap, async_scheduling=self.async_scheduling)
        self.engine = Engine(self.program, self.config, threaded=False, clock=self.clock)
        self.solo_cache: dict[Any, tuple[int, ...]] = {}

    def _commit_guard(self, t: Tracked, preview: Any) -> None:
        self.program.check_no_pending_batch()
        if preview.terminal and t.rid not in self.watch.settled:
            self.watch.violations.append(f"request {t.rid}: terminal output committed before its resource result")

    @rule(data=st.data(), prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(1, 90), max_size=12),
          max_tokens=st.integers(1, 12), deadline=st.one_of(st.none(), st.floats(0.5, 20)),
          seed=st.one_of(st.none(), st.integers(0, 5)), think=st.one_of(st.none(), st.integers(1, 4)),
          timeout=st.one_of(st.none(), st.floats(0.5, 10)))
    def submit(self, data, prefix, suffix, max_tokens, deadline, seed, think, timeout):
        session = data.draw(st.sampled_from(self.session_keys))
        grammar = self.grammar_rows and data.draw(st.booleans())
        self._submit(prefix + tuple(suffix), max_tokens, session, deadline, seed, think, timeout,
                     hints=(len(prefix),), grammar=grammar)

    @precondition(lambda self: any(t.result is not None for t in self.model.tracked))
    @rule(data=st.data(), suffix=st.lists(st.integers(1, 90), min_size=1, max_size=8),
          max_tokens=st.integers(1, 12), seed=st.one_of(st.none(), st.integers(0, 5)),
          dropped=st.sampled_from([None, 2]))
    def submit_next_turn(self, data, suffix, max_tokens, seed, dropped):
        """A conversation's next turn, same session key: the previous prompt and output then new tokens (an agent
        loop), or with `dropped` the previous prompt less its last tokens and without the output (a chat turn whose
        rendering drops the reasoning); the previous request marked that point as a turn boundary."""
        prev = data.draw(st.sampled_from([t for t in self.model.tracked if t.result is not None]))
        head = prev.request.prompt + prev.result.token_ids if dropped is None else prev.request.prompt[:-dropped]
        self._submit(head + tuple(suffix), max_tokens, prev.request.session_key, None, seed, None, None)

    def _submit(self, prompt, max_tokens, session_key, deadline, seed, think, timeout, hints=(), grammar=False):
        box: list[Tracked] = []
        mask = AlternateMask(self.program.limits.vocab_size) if grammar else None
        out = TokenSession(max_tokens, think_budget=think, commit_guard=lambda p: self._commit_guard(box[0], p),
                           mask=mask, stop_ids=self.stop_ids)
        turn = (len(prompt) - 2,)  # where a next turn that drops this one's reasoning diverges
        sampling = None if seed is None else SamplingParams(temperature=0.7)
        req = GenerationRequest(prompt, out, max_tokens, sampling=sampling, seed=seed if seed is not None else 0,
                                session_key=session_key,
                                capture_hints=tuple(h for h in hints + turn if 0 < h < len(prompt)),
                                deadline=None if deadline is None else self.clock.now + deadline,
                                queue_timeout=timeout)
        try:
            handle = self.engine.submit(req)
        except RequestRejected:
            ok = (not self.engine.available or self.model.outstanding() >= self.config.max_outstanding
                  or len(prompt) + max_tokens > self.program.limits.max_context)
            assert ok, "a request was rejected without cause"
            return
        t = Tracked(handle, req, len(self.model.tracked), self.clock.now)
        box.append(t)
        handle._rec.events = Stamped(self.model, t)  # the worker has not run since submit: nothing published yet
        self.model.add(t, think)

    @precondition(lambda self: self.model.tracked)
    @rule(data=st.data(), abandon=st.booleans())
    def cancel(self, data, abandon):
        live = [t for t in self.model.tracked if t.result is None]
        # Mostly a request still in flight; sometimes any (a cancel after the end must change nothing).
        t = data.draw(st.sampled_from(live if live and data.draw(st.booleans()) else self.model.tracked))
        if abandon:
            t.abandoned = True
            t.handle.close()
        else:
            t.cancelled = True
            t.handle.cancel()

    @precondition(lambda self: any(not t.cancelled for t in self.model.tracked if t.rid in self.watch.materializing()))
    @rule(data=st.data())
    def cancel_while_materializing(self, data):
        """Cancel at the seed's hardest moment: the request's resource transition is open."""
        rids = [r for r in self.watch.materializing() if not self.model.by_rid[r].cancelled]
        t = self.model.by_rid[data.draw(st.sampled_from(rids))]
        t.cancelled = True
        t.handle.cancel()

    @precondition(lambda self: any(t.request.deadline is not None and t.result is None
                                   and t.rid in self.watch.started for t in self.model.tracked))
    @rule(data=st.data())
    def pass_a_deadline(self, data):
        """Let the deadline of an admitted request pass."""
        t = data.draw(st.sampled_from([t for t in self.model.tracked if t.request.deadline is not None
                                       and t.result is None and t.rid in self.watch.started]))
        self.clock.now = max(self.clock.now, t.request.deadline + 0.01)

    @precondition(lambda self: any(t.result is not None and not (t.consumed or t.abandoned)
                                   for t in self.model.tracked))
    @rule(data=st.data())
    def consume(self, data):
        """The consumer takes its finished result (only then may capacity be released)."""
        t = data.draw(st.sampled_from([t for t in self.model.tracked if t.result is not None
                                       and not (t.consumed or t.abandoned)]))
        self._consume(t)

    def _consume(self, t: Tracked) -> None:
        got = list(t.handle.events(timeout=0))
        assert got == t.events, "the handle yields other events than were published"
        t.consumed = True

    @rule(n=st.integers(1, 6))
    def advance_worker(self, n):
        for _ in range(n):
            self._step()

    @rule()
    def run_until_idle(self):
        """Let everything submitted so far finish, so later submissions meet published checkpoints."""
        for _ in range(2_000):
            if not self._step():
                break

    def _step(self) -> bool:
        cancelled = frozenset(t.rid for t in self.model.tracked if (t.cancelled or t.abandoned) and t.result is None)
        expired = frozenset(t.rid for t in self.model.tracked if t.result is None and self.model.expired(t))
        self.watch.begin_boundary(cancelled, expired)
        STEPS[0] += 1
        worked = self.engine.step()
        if not self.engine.available:
            self.watch.stop_checking()
        if self.program.fired == "corrupt":
            assert not self.engine.available, "the Engine proceeded on a corrupted Program value"
        assert self.program.pending_batches == 0, "a PendingBatch was left unconsumed at the end of a boundary"
        self.model.check_session_index(self.engine.core.resources)
        return worked

    @rule(dt=st.floats(0.1, 5.0))
    def advance_clock(self, dt):
        self.clock.now += dt

    @precondition(lambda self: self.fault_run and not self.program.fired)
    @rule(data=st.data(), after=st.integers(0, 6))
    def inject_fault(self, data, after):
        method = data.draw(st.sampled_from(self.fault_methods))
        mode = data.draw(st.sampled_from(self.fault_modes))
        if mode == "corrupt" and method not in ("prefill", "decode", "control", "advance", "abort"):
            mode = "raise_after"
        self.program.arm(method, after, mode, data.draw(st.sampled_from(self.fault_variants)))

    @invariant()
    def events_are_well_formed(self):
        for t in self.model.tracked if hasattr(self, "model") else ():
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
    def seed_rules_hold(self):
        if hasattr(self, "watch"):
            assert not self.watch.violations, self.watch.violations[0]

    @invariant()
    def engine_fails_only_from_injected_faults(self):
        """A raised fault fails the Engine with InjectedFault, a corrupted value with a typed EngineFailure."""
        if hasattr(self, "engine") and not self.engine.available:
            failure = self.engine.failure or ""
            expected = {"raise": "InjectedFault", "corrupt": "EngineFailure"}.get(self.program.fired)
            assert expected and failure.startswith(expected), f"engine failed without an injected fault: {failure}"

    @invariant()
    def capacity_follows_the_release_rule(self):
        if hasattr(self, "engine"):
            model = self.model.outstanding()
            assert self.engine.outstanding == model, f"outstanding {self.engine.outstanding} != model {model}"

    def teardown(self):
        if not hasattr(self, "engine"):
            return
        self.program.disarm()
        for _ in range(10_000):
            if not self._step() and not self.engine.core.records and not len(self.engine.core.inbox):
                break
        assert not self.watch.violations, self.watch.violations[0]
        for t in self.model.tracked:
            if not t.abandoned:
                assert t.result is not None, "request never finished"
                if not t.consumed:
                    self._consume(t)
                self._check_schedule_invariance(t)
        assert self.engine.outstanding == 0 == self.model.outstanding(), "capacity not released after drain"
        event(f"engine failed: {not self.engine.available}")
        stats = self.engine.core.resources.stats
        event(f"demoted to a host replica: {stats.demotions > 0}")
        event(f"promoted from a host replica: {stats.promotions > 0}")
        if self.async_scheduling:
            inner = self.program.inner
            launched, adopted = getattr(inner, "ahead_launched", 0), getattr(inner, "ahead_adopted", 0)
            event(f"steps launched ahead: adopted {adopted > 0}, discarded {launched > adopted}")
        if self.engine.available:
            usage = self.program.inner.resource_usage()
            assert usage.active_sequences == 0 and usage.reserved_pages == 0 and usage.sequence_pages == 0, usage
            assert usage.free_pages + usage.checkpoint_pages == usage.total_pages, usage
            self.engine.core.check_invariants()

    def _check_schedule_invariance(self, t: Tracked):
        result = t.result
        event(f"finish: {result.finish_reason.value}")
        if result.usage.cached_prompt_tokens:
            event("prefix cache hit")
        if any(len(e.token_ids) > 1 for e in t.events if isinstance(e, OutputDelta)):
            event("multi-token commit")
        if result.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH) or result.error:
            return
        think = self.model.budgets.get(t.rid)
        key = (t.request.prompt, t.request.max_tokens, t.request.seed, t.request.sampling, think,
               t.request.session.mask is not None)
        if key not in self.solo_cache:
            cls = type(self)
            solo = cls.oracle if cls.oracle is not None and t.request.sampling is None else cls.factory
            self.solo_cache[key] = solo_tokens(solo, t.request, think)
        assert result.token_ids == self.solo_cache[key], "output depends on the schedule"


def make_engine_machine(factory: ProgramFactory, *, max_concurrency: int = 3, faults: bool = True,
                        fault_methods: tuple[str, ...] = FAULTABLE, fault_modes: tuple[str, ...] = MODES,
                        fault_variants: tuple[int, ...] = (0, 1, 2, 3, 4),
                        session_keys: tuple[str | None, ...] = (None, "a", "b"), oracle: ProgramFactory | None = None,
                        async_scheduling: bool = False, grammar_rows: bool = False, stop_ids: tuple[int, ...] = (0,)):
    """The Engine state machine over Programs made by `factory` (one fresh Program per example); the fault and
    session-key arguments narrow what it draws (a targeted hunt); with `oracle`, greedy requests must also equal
    their solo run on the oracle's Program (speculation on vs off); with `async_scheduling` the Engine launches
    decode rounds ahead, and every request must still equal its solo run on a synchronous Engine; with
    `grammar_rows` some requests are masked at every other output token (rounds that fall back to synchronous);
    `stop_ids`: every request's stop tokens (more than eos: requests end mid-stream, beside rows that go on)."""
    return type("EngineMachine", (EngineMachine,), {
        "factory": staticmethod(factory), "max_concurrency": max_concurrency, "faults": faults,
        "fault_methods": fault_methods, "fault_modes": fault_modes, "fault_variants": fault_variants,
        "session_keys": session_keys, "oracle": None if oracle is None else staticmethod(oracle),
        "async_scheduling": async_scheduling, "grammar_rows": grammar_rows, "stop_ids": stop_ids})
