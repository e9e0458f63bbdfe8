"""Async scheduling: after a decode round is committed, launch the round the next boundary will run, so the device
computes it while the host commits the sessions, publishes and runs that boundary (docs/engine.md "Async
scheduling").

Only a prediction is made here; correctness never rests on it. The Program holds the launched step as provisional
state that no one can see: the next `decode` of exactly these rows adopts it, and any other mutating call (a
transition's advance, a prefill, a control step, a different or masked round) first rolls it back. A wrong
prediction costs one discarded device step, so the Engine launches only when the next boundary will, as far as
it can tell now, run the same round: every row continues unmasked, and nothing is waiting to be settled, admitted
or forced. A staged prefill is predicted as the chunk riding in that round (mixed units), sized now as the unit
will size it, when it leaves prompt tokens; a prompt's last chunk is not launched ahead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ninfer.contracts import PrefillChunk, RequestState, RowDecision

if TYPE_CHECKING:
    from .core import EngineCore
    from .records import RequestRecord


def launch_next_round(core: "EngineCore", recs: Sequence["RequestRecord"], previews: Sequence[Any],
                      decisions: Sequence[RowDecision]) -> bool:
    """Right after `Program.commit` of an unmasked decode round: launch the same rows' next step when the next
    boundary is predicted to run exactly that round, with the chunk of the staged prefill that will ride in it
    (mixed units) when that chunk leaves prompt tokens. True when a step was launched."""
    launch = getattr(core.program, "launch_ahead", None)
    if launch is None or not _rows_continue(core, recs, previews, decisions):
        return False
    chunk = _riding_chunk(core, len(recs)) if core.scheduler.staged_prefill else None
    if (core.scheduler.staged_prefill and chunk is None) or not _quiet(core):
        return False
    handles = [r.handle for r in recs]
    return bool(launch(handles) if chunk is None else launch(handles, chunk))


def _riding_chunk(core: "EngineCore", rows: int) -> PrefillChunk | None:
    """The chunk the next mixed unit's rider (the next staged prefill in round robin) will run beside `rows` decode
    rows, sized as the unit will size it; None when no mixed unit comes next or the chunk would finish its prompt
    (it samples a first token under the grammar's mask and changes the next round's rows)."""
    sched = core.scheduler
    if not sched.mixed or sched.control_ready:
        return None
    rec = core.records[sched.staged_prefill[0]]
    if not core.program.prompt_remaining(rec.handle):  # it finished in the round just committed: it leaves next
        return None
    size, remaining = core.units.chunk_size(rec, rows, mixed=True)
    return PrefillChunk(rec.handle, size) if size < remaining else None


def _rows_continue(core: "EngineCore", recs: Sequence["RequestRecord"], previews: Sequence[Any],
                   decisions: Sequence[RowDecision]) -> bool:
    """Every row stays decode-ready: drawn and previewed, accepted, not terminal, needing no forced control, not
    cancelled and not past its deadline (each of those ends or moves the row at the next boundary)."""
    now = core.clock()
    for rec, p, d in zip(recs, previews, decisions):
        if p is None or d.accepted == 0 or d.terminal or p.needs_control or rec.cancel_requested:
            return False
        if rec.request.deadline is not None and now > rec.request.deadline:
            return False
    return True


def _quiet(core: "EngineCore") -> bool:
    """Nothing the next boundary would do before its unit calls the Program: no open transition, no settlement
    (a terminal request, a pending capture), no admission attempt, no forced control (a staged prefill only as the
    chunk riding in the round, which the caller predicted)."""
    sched = core.scheduler
    if core.txn is not None or core.cancel_all or sched.control_ready:
        return False
    if sched.waiting and sched.admission_dirty:
        return False
    return not any(r.state is RequestState.TERMINAL_PENDING or r.capture_pending for r in core.records.values())
