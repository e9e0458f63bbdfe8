"""Running one model execution unit and committing it in the seed's order:

  Frontend preview -> Program commit -> terminal resource result (when the row ends) -> budget and scheduler
  accounting -> OutputSession commit -> publish.

A PendingBatch is consumed exactly once: by `Program.commit`, or, when anything before the commit fails, by
`abort_pending` in the Engine's failure cleanup (`failure.py`), which finds it in `core.pending`. A terminal row's
output waits on its record (`rec.final`) until the retain or release result is adopted (`transitions.py`); only
then is it accounted, committed into the OutputSession and published.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ninfer.contracts import (ROW_FAILURE_TEXT, EngineFailure, FinishReason, OutputDelta, PendingBatch, PendingRow,
                              PrefillChunk, RequestState, RowDecision)

from .ahead import launch_next_round
from .chunking import prefill_chunk
from .rules import accepted_fits_budget, budget_room
from .scheduler import Unit

if TYPE_CHECKING:
    from .core import EngineCore
    from .records import RequestRecord

_ACTIVE = (RequestState.PREFILL, RequestState.DECODE_READY, RequestState.CONTROL_READY)
_FAILED = object()  # a session call that raised (`UnitRunner._ask`)


@dataclass(frozen=True)
class CommittedOutput:
    """One row's output after the Program committed it, before accounting, session commit and publication."""

    tokens: tuple[int, ...]
    preview: Any
    logprobs: tuple[float, ...] | None
    top_logprobs: tuple | None

    @classmethod
    def of(cls, row: PendingRow, preview: Any, n: int) -> "CommittedOutput":
        return cls(row.tokens[:n], preview, None if row.logprobs is None else row.logprobs[:n],
                   None if row.top_logprobs is None else row.top_logprobs[:n])


class UnitRunner:
    def __init__(self, core: "EngineCore"):
        self.core = core

    def end_cancelled(self, cancelled: frozenset[int]) -> bool:
        """Cancelled or expired active requests stop at this stable boundary and go to TerminalPending; their
        output so far is ended and published once the release result is adopted."""
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
            suffix = self._ask(rec, "control suffix", rec.request.session.control_suffix)
            if suffix is _FAILED:
                return
            if not suffix:
                raise EngineFailure(f"request {rec.rid} is ControlReady but its session has no control suffix")
            bad = next((t for t in suffix if not 0 <= t < program.limits.vocab_size), None)
            if bad is not None:  # a model call on it would fail the Engine (or assert on the device)
                self._fail(rec, "control suffix", f"token id {bad} outside the vocabulary")
                return
            self._commit(program.control(rec.handle, suffix), recs, forced=True)
        elif unit.kind == "prefill":
            rec = recs[0]
            chunk = self._chunk(rec, mixed=False)
            if chunk is not None:
                self._run_prefill(rec, chunk)
        else:
            self._run_decode(recs, unit.riding)

    def _chunk(self, rec: "RequestRecord", mixed: bool) -> PrefillChunk | None:
        """`rec`'s next prefill chunk, sized beside the decode-ready rows (riding in their round's pass when
        `mixed`), with the grammar's mask when it finishes the prompt (only that chunk samples); None when the
        session failed to give the mask (the request ended alone)."""
        size, remaining = self.chunk_size(rec, len(self.core.scheduler.decode_ready), mixed)
        mask = self._ask(rec, "mask", rec.request.session.next_token_mask) if size == remaining else None
        return None if mask is _FAILED else PrefillChunk(rec.handle, size, mask)

    def chunk_size(self, rec: "RequestRecord", rows: int, mixed: bool) -> tuple[int, int]:
        """(tokens of `rec`'s next prefill chunk beside `rows` decoding rows, its prompt tokens left)."""
        program, config = self.core.program, self.core.config
        remaining = program.prompt_remaining(rec.handle)
        size, _ = prefill_chunk(program.limits.prefill, remaining, len(rec.prompt) - remaining, rows,
                                config.prefill_chunk, config.prefill_itl_ratio, mixed)  # one lane's per boundary
        return size, remaining

    def _run_prefill(self, rec: "RequestRecord", chunk: PrefillChunk) -> None:
        batch = self.core.program.prefill(rec.handle, chunk.max_tokens, chunk.mask)
        if batch is not None:
            self._commit(batch, [rec], forced=False)
            rec.capture_pending = self.core.config.prefix_caching

    def _run_decode(self, recs: list["RequestRecord"], riding: int | None) -> None:
        """The decode round of `recs`, carrying the next chunk of staged prefill `riding` (a mixed unit) if any."""
        program = self.core.program
        rider = None if riding is None else self.core.records[riding]
        chunk = None if rider is None else self._chunk(rider, mixed=True)
        # a speculative backend: each row's grammar over its draft prefixes
        ask = "draft_masks" if program.limits.draft_tokens else "next_token_mask"
        masks = [self._ask(r, "mask", getattr(r.request.session, ask)) for r in recs]
        recs, masks = [r for r, m in zip(recs, masks) if m is not _FAILED], [m for m in masks if m is not _FAILED]
        if not recs:
            if chunk is not None:
                self._run_prefill(rider, chunk)
            return
        masked = any(m is not None for m in masks)
        if chunk is None:
            batch = program.decode([r.handle for r in recs], masks if masked else None)
            # a masked round's next masks depend on the tokens just drawn: it stays synchronous (a speculative
            # row's draft masks too, and a block bound its session gives)
            self._commit(batch, recs, forced=False, ahead=not masked)
            return
        finishes = chunk.max_tokens >= program.prompt_remaining(rider.handle)
        batch = program.decode([r.handle for r in recs], masks if masked else None, chunk)
        if finishes:  # before the commit: the next round launched ahead would only be discarded by the capture
            rider.capture_pending = self.core.config.prefix_caching
        self._commit(batch, recs + [rider] if finishes else recs, forced=False, ahead=not masked)

    def _ask(self, rec: "RequestRecord", what: str, call: Callable[[], Any]) -> Any:
        """A session's answer before a model call (its mask, its control suffix), or _FAILED when the session
        raised: a Frontend failure ends its own request only, as in `_preview`."""
        try:
            return call()
        except EngineFailure:
            raise
        except Exception as e:  # noqa: BLE001 - a Frontend failure ends its own request only
            self._fail(rec, what, str(e))
            return _FAILED

    def _fail(self, rec: "RequestRecord", what: str, why: str) -> None:
        """End `rec` alone before its model call: nothing of this unit reached the Program for it."""
        rec.error = f"frontend {what} failed: {why}"
        self.enter_terminal(rec, FinishReason.ERROR)

    def _commit(self, batch: PendingBatch, recs: Sequence["RequestRecord"], *, forced: bool,
                ahead: bool = False) -> None:
        self.core.pending = batch  # unconsumed until commit; the failure cleanup aborts it if anything raises
        if len(batch.rows) != len(recs):
            raise EngineFailure(f"{batch.kind.value} returned {len(batch.rows)} rows for {len(recs)} sequences")
        previews, decisions = self._preview(batch, recs, forced)
        batch.check_decisions(decisions)
        self.core.program.commit(batch.take(), decisions)
        self.core.pending = None
        if ahead and self.core.config.async_scheduling:
            launch_next_round(self.core, recs, previews, decisions)
        for row, rec, preview, decision in zip(batch.rows, recs, previews, decisions):
            self._after_commit(rec, row, preview, decision)

    def _preview(self, batch: PendingBatch, recs: Sequence["RequestRecord"], forced: bool):
        previews: list[Any] = []
        decisions: list[RowDecision] = []
        for row, rec in zip(batch.rows, recs):
            if row.handle != rec.handle:
                raise EngineFailure(f"batch row {row.handle} does not belong to request {rec.rid} ({rec.handle})")
            if row.failure is not None:  # nothing was drawn: this request ends alone, the other rows go on
                rec.failure, rec.error = row.failure, f"sampling failed: {ROW_FAILURE_TEXT[row.failure]}"
                previews.append(None)
                decisions.append(RowDecision(accepted=0, terminal=True, cancelled=True))
                continue
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

    def _after_commit(self, rec: "RequestRecord", row: PendingRow, preview: Any, decision: RowDecision) -> None:
        if row.drafted and row.produced:
            _count_block(rec, row)
        if decision.boundary is not None:
            rec.boundary = row.base_frontier + decision.boundary  # the same absolute position the Program commits
        if preview is None:  # a failed draw or a failed Frontend preview (a cancelled row decision): nothing to publish
            self.enter_terminal(rec, FinishReason.ERROR)
            return
        out = CommittedOutput.of(row, preview, decision.accepted)
        if decision.terminal:
            # The terminal resource result comes first: the output is accounted and published on its adoption.
            rec.final = out
            self.enter_terminal(rec, preview.finish_reason or FinishReason.STOP)
            return
        rec.output_tokens.extend(out.tokens)  # budget accounting
        # Scheduler accounting reads the preview: a forced-control need is known before the session commits.
        if preview.needs_control:
            rec.move(RequestState.CONTROL_READY)
            self.core.scheduler.set_control_ready(rec.rid)
        elif rec.state is not RequestState.DECODE_READY:
            rec.move(RequestState.DECODE_READY)
            self.core.scheduler.set_decode_ready(rec.rid, rec.lane)
        self._publish(rec, out)

    def publish_final(self, rec: "RequestRecord") -> None:
        """After the terminal result was adopted: account, commit and publish the final output; a request ended
        by its deadline or a cancellation ends its session instead and publishes what the session held back."""
        out, rec.final = rec.final, None
        if out is not None:
            rec.output_tokens.extend(out.tokens)
            self._publish(rec, out)
        elif rec.finish_reason in (FinishReason.DEADLINE, FinishReason.CANCELLED):
            try:
                tail = rec.request.session.end(rec.finish_reason)
            except Exception as e:  # noqa: BLE001 - a Frontend failure ends this request, not the Engine
                rec.error = f"frontend failed to end the output: {e}"
                return
            rec.output_ended = True
            if tail is not None:
                rec.events.put(OutputDelta(rec.rid, (), tail))

    def _publish(self, rec: "RequestRecord", out: CommittedOutput) -> None:
        delta = rec.request.session.commit(out.preview)  # the OutputSession commits after the Program
        rec.output_ended = rec.output_ended or out.preview.terminal
        rec.events.put(OutputDelta(rec.rid, out.tokens, delta, out.logprobs, out.top_logprobs))


def _count_block(rec: "RequestRecord", row: PendingRow) -> None:
    """A speculative row's drafts and what verification accepted of them (the Engine may still cut the block)."""
    rec.drafted += row.drafted
    rec.accepted_drafts += row.produced - 1
    while len(rec.blocks) < row.produced:
        rec.blocks.append(0)
    rec.blocks[row.produced - 1] += 1
