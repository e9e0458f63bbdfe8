"""Settling resource transitions: which capture or terminal settlement starts next, and how a finished
transition's result is adopted (ResourceManager first, then lane and request state, then publication)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ninfer.contracts import (EngineFailure, FinishReason, GenerationStart, Infeasible, RequestState, ResourceResult,
                              TransitionKind)

from .retention import TerminalFacts

if TYPE_CHECKING:
    from .core import EngineCore
    from .records import RequestRecord

_SUCCESS = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.TOOL_CALLS)


def next_settlement(core: "EngineCore") -> bool:
    """Start at most one transition: a terminal request's pending capture, then its retain/release (lanes free
    up first), then captures of active requests, then deletions past the retention cap, then the promotion of a
    host replica that earned a hit."""
    terminal = [r for r in core.records.values() if r.state is RequestState.TERMINAL_PENDING]
    for rec in terminal:
        if rec.capture_pending and _start_capture(core, rec):
            return True
        _start_terminal(core, rec)
        return True
    for rec in core.records.values():
        if rec.capture_pending and rec.handle is not None and _start_capture(core, rec):
            return True
    eviction = core.resources.eviction_choice(core.config.max_cached_checkpoints, core.cache_usage,
                                              core.config.cache_device_share)
    if eviction is not None:
        return core.begin_transition(eviction, None) is True
    placement = core.resources.placement_choice(core.program.resource_revision)
    if placement is None:
        return False
    outcome = core.begin_transition(placement, None)
    if isinstance(outcome, Infeasible):
        # The replica still serves hits from the host; the promotion waits for the Program's resources to change.
        core.resources.defer_placement(core.program.resource_revision)
    return outcome is True


def _start_capture(core: "EngineCore", rec: "RequestRecord") -> bool:
    rec.capture_pending = False
    choice = core.resources.capture_choice(rec.handle, len(rec.prompt))
    if choice is None:
        return False
    # A capture that does not fit is simply skipped: it is a cache opportunity, not an obligation.
    return core.begin_transition(choice, rec) is True


def _start_terminal(core: "EngineCore", rec: "RequestRecord") -> None:
    succeeded = rec.finish_reason in _SUCCESS and rec.error is None
    facts = TerminalFacts(rec.rid, rec.frontier, rec.boundary, rec.request.session_key, succeeded)
    choice = core.resources.terminal_choice(rec.handle, facts)
    outcome = core.begin_transition(choice, rec)
    if isinstance(outcome, Infeasible):
        # Retention that cannot form a complete continuation ends deterministically in release.
        outcome = core.begin_transition(core.resources.release_choice(rec.handle), rec)
        if isinstance(outcome, Infeasible):
            raise EngineFailure(f"Program cannot release request {rec.rid}: {outcome.reason}")


def adopt_result(core: "EngineCore", result: ResourceResult, owner: "RequestRecord | None", *,
                 aborted: bool) -> None:
    kind = result.kind
    if kind is TransitionKind.MATERIALIZE:
        assert owner is not None
        core.resources.adopt(result, rid=owner.rid, lane=owner.lane)
        _after_materialize(core, result, owner, aborted)
    elif kind in (TransitionKind.RETAIN, TransitionKind.RELEASE):
        assert owner is not None
        core.resources.adopt(result, rid=owner.rid, lane=owner.lane, session_key=owner.request.session_key,
                             publication_order=owner.publication_order)
        owner.lane, owner.handle = None, None
        core.units.publish_final(owner)  # budget accounting, OutputSession commit, publish: after the result
        core.finish(owner, owner.finish_reason or FinishReason.ERROR)
    else:
        core.resources.adopt(result, rid=owner.rid if owner is not None else None, lane=None)


def _after_materialize(core: "EngineCore", result: ResourceResult, rec: "RequestRecord", aborted: bool) -> None:
    if not result.succeeded:
        if not aborted:
            # The Program sealed this plan at its current revision and started it: a shortfall now means its own
            # accounting broke. An invariant break fails the Engine; it is never downgraded to a rejection.
            raise EngineFailure(f"materialization of request {rec.rid} failed after its plan was sealed and "
                                f"started: {result.detail or 'no detail'}")
        rec.lane = None
        rec.error = "cancelled while materializing"
        core.finish(rec, FinishReason.CANCELLED)
        return
    if result.handle is None:
        raise EngineFailure(f"materialization of request {rec.rid} succeeded without a sequence")
    rec.handle, rec.reused_tokens = result.handle, result.reused_tokens
    rec.move(RequestState.PREFILL)
    core.scheduler.start_prefill(rec.rid)
    rec.events.put(GenerationStart(rec.rid, len(rec.prompt), result.reused_tokens))
