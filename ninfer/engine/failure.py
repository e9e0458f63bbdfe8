"""Engine-wide failure: shared physical state can no longer be explained, so every request ends.

Cleanup order (the seed's): first end the Program's open resource transaction, then release active state by
discarding the Program with the Engine, then clear the ResourceManager's view and complete every response.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ninfer.contracts import FinishReason, GenerationResult, RequestState, Usage

if TYPE_CHECKING:
    from .core import EngineCore

log = logging.getLogger("ninfer.engine")


def fail_engine(core: "EngineCore", exc: BaseException) -> None:
    core.failed = f"{type(exc).__name__}: {exc}"
    log.error("engine failed: %s", core.failed, exc_info=exc)
    if core.txn is not None:
        txn, core.txn, core.txn_owner = core.txn, None, None
        try:
            core.program.abort(txn)
        except Exception:  # noqa: BLE001 - the Engine is already failing; the Program is discarded with it
            log.exception("aborting the open transaction during failure cleanup failed")
    records = list(core.records.values()) + list(core.inbox)
    core.inbox.clear()
    core.records.clear()
    core.resources.catalog.clear()
    core.resources.by_length.clear()
    core.resources.sessions.clear()
    for rec in records:
        # Failure cleanup deliberately bypasses the lifecycle table: no state of this Engine is trusted any more.
        rec.state = RequestState.FINISHED
        rec.finish_reason = FinishReason.ERROR
        rec.error = f"engine failed: {core.failed}"
        usage = Usage(len(rec.prompt), len(rec.output_tokens), rec.reused_tokens)
        rec.events.put(GenerationResult(rec.rid, FinishReason.ERROR, usage, tuple(rec.output_tokens), None, rec.error))
        core.on_finish(rec)
