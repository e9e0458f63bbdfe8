"""Engine-wide failure: shared physical state can no longer be explained, so every request ends.

Cleanup order (the seed's): first end the Program's open transactions (the resource transition with `abort`, an
unconsumed PendingBatch with `abort_pending`), then release the active state (each sequence still held goes
through a RELEASE transition), then clear the ResourceManager, and last complete every response: the requests the
worker knew and those still in the submission inbox, which is closed first so that no later submit slips past.
The Program is not trusted any more, so each cleanup step that fails is logged and the next one still runs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ninfer.contracts import FinishReason, GenerationResult, RequestState, ResourceChoice, TransitionKind, Usage

if TYPE_CHECKING:
    from .core import EngineCore

log = logging.getLogger("ninfer.engine")

_RELEASE_STAGES = 16  # a release that has not finished after this many stages is abandoned with the Program


def fail_engine(core: "EngineCore", exc: BaseException) -> None:
    core.failed = f"{type(exc).__name__}: {exc}"
    log.error("engine failed: %s", core.failed, exc_info=exc)
    core.inbox.close(f"engine failed: {core.failed}")
    _abort_open_transactions(core)
    _release_active_state(core)
    core.resources.clear()
    _complete_responses(core)


def _abort_open_transactions(core: "EngineCore") -> None:
    if core.txn is not None:
        txn, core.txn, core.txn_owner = core.txn, None, None
        _attempt("aborting the open resource transition", lambda: core.program.abort(txn))
    batch, core.pending = core.pending, None
    if batch is not None and not batch.consumed:
        _attempt("aborting the unconsumed PendingBatch", lambda: core.program.abort_pending(batch.take()))


def _release_active_state(core: "EngineCore") -> None:
    for rec in core.records.values():
        handle, rec.handle, rec.lane = rec.handle, None, None
        if handle is not None:
            _attempt(f"releasing request {rec.rid}'s sequence", lambda: _release(core, handle))


def _release(core: "EngineCore", handle) -> None:
    plan = core.program.plan(ResourceChoice(TransitionKind.RELEASE, handle=handle))
    txn = core.program.start(plan)
    for _ in range(_RELEASE_STAGES):
        if core.program.advance(txn) is not None:
            return
    raise RuntimeError(f"release of {handle} did not finish in {_RELEASE_STAGES} stages")


def _complete_responses(core: "EngineCore") -> None:
    records = list(core.records.values()) + core.inbox.take_all()
    core.records.clear()
    for rec in records:
        # Failure cleanup deliberately bypasses the lifecycle table: no state of this Engine is trusted any more.
        rec.state = RequestState.FINISHED
        rec.finish_reason = FinishReason.ERROR
        rec.error = f"engine failed: {core.failed}"
        usage = Usage(len(rec.prompt), len(rec.output_tokens), rec.reused_tokens)
        rec.events.put(GenerationResult(rec.rid, FinishReason.ERROR, usage, tuple(rec.output_tokens), None, rec.error))
        core.on_finish(rec)


def _attempt(what: str, step) -> None:
    try:
        step()
    except Exception:  # noqa: BLE001 - the Engine is already failing; the Program is discarded with it
        log.exception("%s during failure cleanup failed", what)
