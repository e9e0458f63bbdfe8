"""Admission: the Scheduler names the one request that may be tried, the ResourceManager chooses its source and
victims, the Program proves feasibility. Resource conditions never reorder the FIFO except through a backfill that
the Program proved harmless to the protected head."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ninfer.contracts import EngineFailure, Infeasible, RejectReason, RequestState, ResourceChoice, ResourcePlan

if TYPE_CHECKING:
    from .core import EngineCore
    from .records import RequestRecord


def _choice(core: "EngineCore", rec: "RequestRecord", *, from_root: bool = False) -> ResourceChoice:
    return core.resources.materialize_choice(rec.rid, rec.prompt, rec.request.max_tokens, rec.request.session_key,
                                             rec.request.sampling, rec.seed, hints=rec.request.capture_hints,
                                             from_root=from_root, media=rec.request.media)


def _active_requests(core: "EngineCore") -> frozenset[int]:
    live = (RequestState.PREFILL, RequestState.DECODE_READY, RequestState.CONTROL_READY)
    return frozenset(r.rid for r in core.records.values() if r.state in live)


def _materialize(core: "EngineCore", rec: "RequestRecord", lane: int, choice: ResourceChoice,
                 plan: ResourcePlan | Infeasible | None = None) -> bool:
    """Start the materialization transition; the request leaves the waiting queue only if it started."""

    def claim() -> None:
        core.scheduler.remove_waiting(rec.rid)
        core.resources.begin_materialize(rec.rid, lane, choice)
        rec.lane = lane
        rec.move(RequestState.MATERIALIZING)

    return core.begin_transition(choice, rec, plan=plan, on_started=claim) is True


def try_admission(core: "EngineCore") -> bool:
    """At most one admission per boundary. Returns True when a request was admitted or rejected."""
    sched = core.scheduler
    head = sched.head()
    assert head is not None
    rec = core.records[head]
    lane = core.resources.free_lane()
    if lane is None:
        sched.protect_head(head, _active_requests(core))
        sched.admission_settled()
        return False
    choice = _choice(core, rec)
    plan = core.program.plan(choice)
    if isinstance(plan, Infeasible) and not plan.permanent and choice.source is not None:
        # The source itself can be what does not fit (its partial page is kept while the request needs one more):
        # from root, with the source among the victims, it may enter now. Never wait on a cache choice.
        choice = _choice(core, rec, from_root=True)
        plan = core.program.plan(choice)
    if isinstance(plan, Infeasible):
        if plan.permanent:
            core.reject(rec, RejectReason.INFEASIBLE, plan.reason)
            return True
        if core.txn is None and all(r.lane is None for r in core.records.values()):
            # Nothing active can ever free resources for it: the Program's "not now" would wait forever.
            raise EngineFailure(f"Program reports request {head} infeasible for now with nothing active: {plan.reason}")
        sched.protect_head(head, _active_requests(core))
        admitted = _try_backfill(core, rec, lane)
        if not admitted:
            sched.admission_settled()
        return admitted
    return _materialize(core, rec, lane, choice, plan)


def _try_backfill(core: "EngineCore", head: "RequestRecord", lane: int) -> bool:
    """Admit one later waiting request only when the Program proves the protected head still enters from root
    once the donor set ends, with the borrower holding its whole reservation. No timing assumption."""
    head_root = _choice(core, head, from_root=True)
    donors = [core.records[r].handle for r in core.scheduler.donors if core.records.get(r) and core.records[r].handle]
    for rid in list(core.scheduler.waiting)[1:]:
        rec = core.records[rid]
        if rec.cancel_requested:
            continue
        borrower = _choice(core, rec)
        if not core.program.backfill_feasible(head_root, donors, borrower):
            continue
        if _materialize(core, rec, lane, borrower):
            return True
    return False
