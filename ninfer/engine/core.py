"""EngineCore: the worker boundary. Only this object mutates records, Scheduler, ResourceManager and Program.

One `boundary()` runs the seed's semantic order:
  waiting timeouts/cancellations -> advance the open resource transition -> settle TerminalPending ->
  freeze the active cancellation snapshot -> at most one admission -> choose and run at most one model unit ->
  commit model, budget and Frontend output -> publish events.
"""

from __future__ import annotations

import time
from typing import Callable

from ninfer.contracts import (EngineFailure, FinishReason, GenerationResult, Infeasible, PendingBatch, Program,
                              RejectReason, RequestState, ResourceChoice, ResourcePlan, ResourceResult,
                              RunningTransaction, StalePlan, Usage)

from .config import EngineConfig
from .inbox import Inbox
from .records import RequestRecord
from .resource_manager import ResourceManager
from .scheduler import Scheduler
from .units import UnitRunner

Clock = Callable[[], float]


class EngineCore:
    def __init__(self, program: Program, config: EngineConfig, *, clock: Clock = time.monotonic):
        if config.max_concurrency > program.limits.max_concurrency:
            raise ValueError(f"max_concurrency {config.max_concurrency} exceeds the Program's "
                             f"{program.limits.max_concurrency}")
        self.program, self.config, self.clock = program, config, clock
        self.scheduler = Scheduler(concurrent_prefill=config.concurrent_prefill,
                                   mixed=config.mixed_prefill and program.limits.mixed_steps)
        self.resources = ResourceManager(config.max_concurrency, prefix_caching=config.prefix_caching,
                                         costs=program.limits.costs)
        self.records: dict[int, RequestRecord] = {}
        self.inbox: Inbox[RequestRecord] = Inbox()  # filled by the facade from any thread
        self.txn: RunningTransaction | None = None  # the one open global topology transition
        self.txn_owner: RequestRecord | None = None
        self.pending: PendingBatch | None = None  # the one model transaction while it is unconsumed
        self.cancel_all = False  # set by Engine.shutdown once its grace period is over
        self.failed: str | None = None
        self.units = UnitRunner(self)
        self._revision = program.resource_revision
        # The Program's occupancy after the last adopted transition: a frozen value other threads may read.
        self.cache_usage = program.resource_usage()
        self.on_finish: Callable[[RequestRecord], None] = lambda rec: None

    def boundary(self) -> bool:
        """Run one worker boundary; True when it did any work. Never raises: failures fail the Engine."""
        if self.failed:
            return False
        try:
            worked = self._boundary()
            if self.config.check_invariants:
                self.check_invariants()
            return worked
        except Exception as e:  # noqa: BLE001 - any escape here means shared state can no longer be explained
            from .failure import fail_engine

            fail_engine(self, e)
            return True

    def _boundary(self) -> bool:
        worked = self._ingest()
        worked |= self._expire_waiting()
        worked |= self._advance_transition()
        if self.txn is None:
            worked |= self._start_settlement()
        cancelled = self._cancellation_snapshot()
        worked |= self.units.end_cancelled(cancelled)
        if self.txn is None and self.scheduler.admission_allowed(topology_open=False):
            worked |= self._try_admission()
        if self.program.resource_revision != self._revision:
            self._revision = self.program.resource_revision
            self.scheduler.note_trigger()
        unit = self.scheduler.next_unit()
        if unit is not None:
            self.units.run(unit, cancelled)
            worked = True
        return worked

    def _ingest(self) -> bool:
        worked = False
        for rec in self.inbox.take_all():
            self.records[rec.rid] = rec
            self.scheduler.enqueue(rec.rid)
            worked = True
        if self.cancel_all:
            for rec in self.records.values():
                rec.cancel_requested = True
        return worked

    def _expire_waiting(self) -> bool:
        now, worked = self.clock(), False
        for rid in list(self.scheduler.waiting):
            rec = self.records[rid]
            timeout = rec.request.queue_timeout or self.config.queue_timeout
            if rec.cancel_requested:
                self.reject(rec, RejectReason.CANCELLED, "cancelled while waiting")
            elif timeout is not None and now - rec.enqueued_at > timeout:
                self.reject(rec, RejectReason.QUEUE_TIMEOUT, f"waited more than {timeout:g} s for admission")
            elif rec.request.deadline is not None and now > rec.request.deadline:
                self.reject(rec, RejectReason.QUEUE_TIMEOUT, "deadline passed while waiting")
            else:
                continue
            worked = True
        return worked

    def reject(self, rec: RequestRecord, reason: RejectReason, message: str) -> None:
        """A request-level rejection: no Program state exists for it."""
        self.scheduler.remove_waiting(rec.rid)
        rec.error = f"{reason.value}: {message}"
        finish = FinishReason.CANCELLED if reason is RejectReason.CANCELLED else FinishReason.REJECTED
        self.finish(rec, finish)

    def _advance_transition(self) -> bool:
        if self.txn is None:
            return False
        owner = self.txn_owner
        aborted = owner is not None and owner.state is RequestState.MATERIALIZING and owner.cancel_requested
        result = self.program.abort(self.txn) if aborted else self.program.advance(self.txn)
        if aborted and result is None:
            raise EngineFailure(f"abort of transaction {self.txn.txn_id} returned no terminal result")
        if result is not None:
            self._adopt(result, aborted=aborted)
        return True

    def begin_transition(self, choice: ResourceChoice, owner: RequestRecord | None, *,
                         plan: ResourcePlan | Infeasible | None = None,
                         on_started: Callable[[], None] | None = None) -> Infeasible | bool:
        """Seal (unless already sealed), start and drive one transition. Returns the Infeasible verdict, False when
        the plan went stale (nothing happened; re-plan after the trigger), True once started. `on_started` runs
        between start and the first stage: the logical claim is taken before any physical stage runs."""
        plan = self.program.plan(choice) if plan is None else plan
        if isinstance(plan, Infeasible):
            return plan
        try:
            self.txn = self.program.start(plan)
        except StalePlan:
            self.scheduler.note_trigger()
            return False
        self.txn_owner = owner
        if on_started is not None:
            on_started()
        result = self.program.advance(self.txn)
        if result is not None:
            self._adopt(result, aborted=False)
        return True

    def _adopt(self, result: ResourceResult, *, aborted: bool) -> None:
        """ResourceManager adopts first; only then may the lane and the request change visible state."""
        txn, owner = self.txn, self.txn_owner
        assert txn is not None
        if result.txn_id != txn.txn_id:
            raise EngineFailure(f"result for transaction {result.txn_id} while {txn.txn_id} is open")
        if result.kind is not txn.plan.choice.kind:
            raise EngineFailure(f"a {result.kind.value} result for the {txn.plan.choice.kind.value} transaction "
                                f"{txn.txn_id}")
        self.txn, self.txn_owner = None, None
        self.scheduler.note_trigger()
        from .transitions import adopt_result

        adopt_result(self, result, owner, aborted=aborted)
        self.cache_usage = self.program.resource_usage()

    def _start_settlement(self) -> bool:
        """Start one pending capture or terminal settlement (terminal first: it frees lanes)."""
        from .transitions import next_settlement

        return next_settlement(self)

    def _try_admission(self) -> bool:
        from .admission import try_admission

        return try_admission(self)

    def _cancellation_snapshot(self) -> frozenset[int]:
        """Active requests whose consumer cancelled or whose deadline passed, frozen for this boundary."""
        now = self.clock()
        out = set()
        for rec in self.records.values():
            if rec.state in (RequestState.PREFILL, RequestState.DECODE_READY, RequestState.CONTROL_READY):
                expired = rec.request.deadline is not None and now > rec.request.deadline
                if rec.cancel_requested or expired:
                    out.add(rec.rid)
        return frozenset(out)

    def finish(self, rec: RequestRecord, reason: FinishReason) -> None:
        """Publish the one terminal result and drop the record from the worker's tables."""
        if rec.state is not RequestState.FINISHED:
            rec.move(RequestState.FINISHED)
        rec.finish_reason = rec.finish_reason or reason
        usage = Usage(prompt_tokens=len(rec.prompt), completion_tokens=len(rec.output_tokens),
                      cached_prompt_tokens=rec.reused_tokens, draft_tokens=rec.drafted,
                      accepted_draft_tokens=rec.accepted_drafts, acceptance_lengths=tuple(rec.blocks))
        output = None
        if rec.output_ended:
            try:
                output = rec.request.session.result()
            except Exception as e:  # noqa: BLE001 - a Frontend bug ends this request, not the Engine
                rec.error = f"frontend failed to produce the result: {e}"
        rec.events.put(GenerationResult(rec.rid, rec.finish_reason, usage, tuple(rec.output_tokens), output,
                                        rec.error, rec.failure))
        self.records.pop(rec.rid, None)
        self.on_finish(rec)

    def check_invariants(self) -> None:
        self.scheduler.check_invariants()
        self.resources.check_invariants()
        self.program.check_invariants()
        lanes = self.resources.lane_owner
        for rec in self.records.values():
            if rec.state in (RequestState.WAITING, RequestState.FINISHED):
                assert rec.lane is None, f"request {rec.rid} in {rec.state.value} holds lane {rec.lane}"
            else:
                assert rec.lane is not None and lanes[rec.lane] == rec.rid, f"request {rec.rid} lost its lane"
            if rec.state in (RequestState.PREFILL, RequestState.DECODE_READY, RequestState.CONTROL_READY):
                assert rec.handle is not None, f"active request {rec.rid} has no sequence"
        owned = {o for o in lanes if o is not None}
        assert owned <= set(self.records), f"lanes owned by unknown requests {owned - set(self.records)}"
        assert (self.txn is None) or (self.txn_owner is None or self.txn_owner.rid in self.records)
