"""The property harness's own account of the requests it submitted, which its checks compare the Engine against
(never against the Engine's counters): submit order, who is waiting, who is excused from the FIFO and decode
rules, the release rule, the checks made as each event is published, and the SessionIndex's bindings."""

from __future__ import annotations

from typing import Any, Callable

from ninfer.contracts import FinishReason, GenerationResult, GenerationStart, OutputDelta

from .tracking import FakeClock, Tracked
from .watch import ProgramWatch

_SUCCESS = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.TOOL_CALLS)


class RequestModel:
    """Owns the ProgramWatch (which asks it who waits before whom and who is excused)."""

    def __init__(self, clock: FakeClock, engine_ok: Callable[[], bool]):
        self.clock = clock
        self.watch = ProgramWatch(waiting_before=self.waiting_before, excused=self.excused, engine_ok=engine_ok)
        self.tracked: list[Tracked] = []
        self.by_rid: dict[int, Tracked] = {}
        self.budgets: dict[int, int | None] = {}  # each request's thinking budget, for its solo run
        self.bindings: dict[str, Any] = {}  # session key -> checkpoint id last seen bound

    def add(self, t: Tracked, think: int | None) -> None:
        self.tracked.append(t)
        self.by_rid[t.rid] = t
        self.budgets[t.rid] = think

    def waiting_before(self, rid: int) -> list[int]:
        t = self.by_rid[rid]
        return [e.rid for e in self.tracked[:t.order]
                if e.rid not in self.watch.started and e.finished_at is None]

    def excused(self, rid: int) -> bool:
        t = self.by_rid.get(rid)
        return t is None or t.cancelled or t.abandoned or self.expired(t) or \
            t.request.session.control_suffix() is not None

    def expired(self, t: Tracked) -> bool:
        now, req = self.clock.now, t.request
        if req.deadline is not None and now > req.deadline:
            return True
        return (req.queue_timeout is not None and t.rid not in self.watch.started
                and now - t.submitted_at > req.queue_timeout)

    def outstanding(self) -> int:
        """The release rule, independently: held until the result is published and the consumer released."""
        return sum(1 for t in self.tracked if not (t.result is not None and (t.consumed or t.abandoned)))

    def on_publish(self, t: Tracked, ev: Any) -> None:
        """Runs inside the worker as the event is published: breaks are recorded, never raised into the Engine."""
        session, settled, violate = t.request.session, t.rid in self.watch.settled, self.watch.violations.append
        if isinstance(ev, OutputDelta) and ev.token_ids:
            if tuple(session.tokens[-len(ev.token_ids):]) != ev.token_ids:
                violate(f"request {t.rid}: delta published before commit")
            if session.finish is not None and not settled:
                violate(f"request {t.rid}: final delta published before the terminal result")
        if isinstance(ev, GenerationResult):
            t.finished_at = self.watch.boundary
            failed = (ev.error or "").startswith("engine failed")
            if any(isinstance(e, GenerationStart) for e in t.events) and not failed and not settled:
                violate(f"request {t.rid}: result published before its sequence was retained or released")
            if (ev.finish_reason not in _SUCCESS or ev.error is not None) and t.rid in self.watch.retained:
                violate(f"request {t.rid} ({ev.finish_reason.value}) was retained")
        t.events.append(ev)

    def check_session_index(self, resources: Any) -> None:
        """After every boundary: a binding whose checkpoint still exists is replaced only by a request submitted
        later."""
        for key, binding in list(self.bindings.items()):
            now = resources.sessions.get(key)
            if now is None or now.checkpoint == binding or binding not in resources.catalog:
                continue
            old_rid, new_rid = self.watch.published_by.get(binding), self.watch.published_by.get(now.checkpoint)
            if old_rid is not None and new_rid is not None:
                assert self.by_rid[new_rid].order > self.by_rid[old_rid].order, \
                    f"session {key!r}: request {new_rid} replaced the binding of later request {old_rid}"
        self.bindings = {k: b.checkpoint for k, b in resources.sessions.items()}
