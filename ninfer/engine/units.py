"""Running one model execution unit and committing it in the seed's order:

  Frontend preview -> Program commit -> budget accounting -> OutputSession commit -> scheduler accounting ->
  publish (the terminal resource result follows at a later boundary, before the final result is published).

A PendingBatch is consumed exactly once inside the unit: by commit, or by abort_pending when anything before the
commit fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ninfer.contracts import (EngineFailure, FinishReason, OutputDelta, PendingBatch, PendingRow, RequestState,
                              RowDecision)

from .rules import accepted_fits_budget, budget_room
from .scheduler import Unit

if TYPE_CHECKING:
    from .core import EngineCore
    from .records import RequestRecord

_ACTIVE = (RequestState.PREFILL, RequestState.DECODE_READY, RequestState.CONTROL_READY)


class UnitRunner:
    def __init__(self, core: "EngineCore"):
        self.core = core

    def end_cancelled(self, cancelled: frozenset[int]) -> bool:
        """Cancelled or expired active requests stop at this stable boundary and go to TerminalPending."""
        worked = False
        for rid in sorted(cancelled):
            rec = self.core.records.get(rid)
            if rec is not None and rec.state in _ACTIVE:
                expired = not rec.cancel_requested
                rec.error = None if expired else "cancelled"
                self.enter_terminal(rec, FinishReason.DEADLINE if expired else FinishReason.CANCELLED)
                worked = True
        return worked

    def enter_terminal(self, rec: "RequestRecord", reason: FinishReason) -> None:
        rec.finish_reason = rec.finish_reason or reason
        rec.move(RequestState.TERMINAL_PENDING)
        self.core.scheduler.leave_active(rec.rid)
        assert rec.lane is not None
        self.core.resources.enter_terminal(rec.lane)

    def run(self, unit: Unit, cancelled: frozenset[int]) -> None:
        recs = [self.core.records[r] for r in unit.requests]
        program = self.core.program
        if unit.kind == "control":
            rec = recs[0]
            suffix = rec.request.session.control_suffix()
            if not suffix:
                raise EngineFailure(f"request {rec.rid} is ControlReady but its session has no control suffix")
            self._commit(program.control(rec.handle, suffix), recs, forced=True)
        elif unit.kind == "prefill":
            rec = recs[0]
            remaining = program.prompt_remaining(rec.handle)
            chunk = min(self.core.config.prefill_chunk, remaining)  # one lane's chunk per boundary
            # Only the chunk that finishes the prompt samples, so only it needs the grammar's mask.
            mask = rec.request.session.next_token_mask() if chunk == remaining else None
            batch = program.prefill(rec.handle, chunk, mask)
            if batch is not None:
                self._commit(batch, recs, forced=False)
                rec.capture_pending = self.core.config.prefix_caching
        else:
            masks = [r.request.session.next_token_mask() for r in recs]
            batch = program.decode([r.handle for r in recs], masks if any(m is not None for m in masks) else None)
            if len(batch.rows) != len(recs):
                program.abort_pending(batch.take())
                raise EngineFailure(f"decode returned {len(batch.rows)} rows for {len(recs)} sequences")
            self._commit(batch, recs, forced=False)

    def _commit(self, batch: PendingBatch, recs: Sequence["RequestRecord"], *, forced: bool) -> None:
        try:
            previews, decisions = self._preview(batch, recs, forced)
            batch.check_decisions(decisions)
        except BaseException:
            if not batch.consumed:
                self.core.program.abort_pending(batch.take())
            raise
        self.core.program.commit(batch.take(), decisions)
        for row, rec, preview, decision in zip(batch.rows, recs, previews, decisions):
            self._account_and_publish(rec, row, preview, decision)

    def _preview(self, batch: PendingBatch, recs: Sequence["RequestRecord"], forced: bool):
        previews: list[Any] = []
        decisions: list[RowDecision] = []
        for row, rec in zip(batch.rows, recs):
            if row.handle != rec.handle:
                raise EngineFailure(f"batch row {row.handle} does not belong to request {rec.rid} ({rec.handle})")
            try:
                p = rec.request.session.preview(row.tokens, forced=forced)
            except EngineFailure:
                raise  # e.g. a token the request's grammar forbids: the Program broke the contract, never downgraded
            except Exception as e:  # noqa: BLE001 - a Frontend failure ends its own request only
                rec.error = f"frontend preview failed: {e}"
                previews.append(None)
                decisions.append(RowDecision(accepted=0, terminal=True, cancelled=True))
                continue
            room = budget_room(rec.request.max_tokens, len(rec.output_tokens))
            if not accepted_fits_budget(p.accepted, p.terminal, room):
                raise EngineFailure(f"request {rec.rid}: session accepted {p.accepted} tokens with {room} left")
            previews.append(p)
            decisions.append(RowDecision(p.accepted, p.terminal, boundary=p.boundary))
        return previews, decisions

    def _account_and_publish(self, rec: "RequestRecord", row: PendingRow, preview: Any,
                             decision: RowDecision) -> None:
        n = decision.accepted
        tokens = row.tokens[:n]
        rec.output_tokens.extend(tokens)  # budget accounting
        if preview is None:
            self.enter_terminal(rec, FinishReason.ERROR)
            return
        delta = rec.request.session.commit(preview)  # the OutputSession commits after the Program
        # Scheduler accounting reads the committed session: a forced-control need exists only after commit.
        if decision.terminal:
            self.enter_terminal(rec, preview.finish_reason or FinishReason.STOP)
        elif rec.request.session.control_suffix():
            rec.move(RequestState.CONTROL_READY)
            self.core.scheduler.set_control_ready(rec.rid)
        elif rec.state is RequestState.DECODE_READY:
            pass  # the common decode path: the request stays in the next round, nothing to reschedule
        else:
            rec.move(RequestState.DECODE_READY)
            self.core.scheduler.set_decode_ready(rec.rid, rec.lane)
        rec.events.put(OutputDelta(rec.rid, tokens, delta,
                                   None if row.logprobs is None else row.logprobs[:n],
                                   None if row.top_logprobs is None else row.top_logprobs[:n]))
