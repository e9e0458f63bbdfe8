"""Program: the whole Program protocol over a `PhysicalStore` and a `ModelExecutor`, for both Programs.

The resource side is `ProgramCore`'s; this adds the model transactions. Prompt tokens are not provisional: a prefill
chunk writes KV and GDN state at once in one model call, which also fills the slot of every capture frontier inside it
(those the ResourceManager chose and a slot was reserved for), and the final chunk's batch holds only the sampled first
token. Decode (a speculative round when a backend runs: `speculation.py`) and control step the live state in place: the
committed GDN state is first saved into the backup slot bound to the sequence's block-table row, and the pages the step
takes are provisional. Commit keeps the stepped state; a rejected row (cancelled, or the whole batch dropped by
abort_pending) gets its slot back from the backup and returns the pages; a speculative row cut short takes the state
after its kept tokens (`speculation.rollback`; a commit's replays, where no kept state exists, in one pass:
`speculation.replay`). With async scheduling a decode round (plain or speculative) may be launched ahead of its
`decode` call (`ahead.py`): every other mutating call first discards it. The reference and fast Programs subclass
this and supply only their store and executor.
"""

from __future__ import annotations

from typing import Any, Sequence

from ninfer.contracts import (BatchKind, EngineFailure, PendingBatch, PendingRow, PrefillChunk, ResourceResult,
                              RowDecision, RunningTransaction, SequenceHandle)

from . import ahead as ahead_step
from .chain import Chained
from .core import ProgramCore
from .execution import (Provisional, capture_cuts, capture_due, capture_filled, grow, prefill_end, provisionals,
                        restore, validate_commit)
from .executor import ModelExecutor
from .mixed import launch_riding, mixed_round
from .speculation import replay, rollback


class Program(ProgramCore):
    executor: ModelExecutor  # set by the subclass before serving
    _ahead: ahead_step.Ahead | None = None  # the decode step launched ahead, not yet adopted by `decode`
    _chained: Chained | None = None  # the step launched behind the adopted one, whose batch is not yet committed
    # steps launched ahead (those chained behind an adopted one included), the chained ones, and those a `decode`
    # adopted
    ahead_launched = ahead_chained = ahead_adopted = 0

    def backup_slot(self, row: int, bank: int = 0) -> int:
        return self.executor.chained_backup(row) if bank else super().backup_slot(row)

    def launch_ahead(self, handles: Sequence[SequenceHandle], prefill: PrefillChunk | None = None) -> bool:
        """Launch the next round of `handles` now, unmasked (the plain step, or a speculative round when a backend
        runs), carrying `prefill` (a chunk that leaves prompt tokens) if given; the next `decode` of exactly these
        rows and chunk adopts it. The step chained behind the round just committed is that round already."""
        if self._ahead is not None and ahead_step.matches(self._ahead, handles, None, prefill):
            return True
        self.discard_ahead()
        self._ahead = ahead_step.launch(self, handles, prefill, launch_riding)
        self.ahead_launched += 1
        return True

    def discard_ahead(self) -> None:
        """Roll back the step launched ahead and the one chained behind a pending batch, if any: every row's
        committed state (the chained step first, to the state its batch left) and reservation come back."""
        chained, self._chained = self._chained, None
        if chained is not None:
            chained.discard(self)
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead_step.discard(self, ahead)

    def ahead_handles(self) -> tuple[SequenceHandle, ...]:
        return () if self._ahead is None else self._ahead.handles

    def ahead_extents(self) -> dict[SequenceHandle, int]:
        """Per row of the round launched ahead, the positions it fed past the frontier (1 for a plain step, the
        block for a speculative round): the pages it holds until adopted or discarded."""
        if self._ahead is None:
            return {}
        extents = {h: len(p.fed) for h, p in zip(self._ahead.handles, self._ahead.provisional)}
        if self._ahead.chunk is not None:  # the riding chunk's pages, held until adopted or discarded
            extents[self._ahead.chunk.handle] = len(self._ahead.rider.fed)
        return extents

    def advance(self, txn: RunningTransaction) -> ResourceResult | None:
        self.discard_ahead()  # a transition may change a mapping the launched step reads
        return super().advance(txn)

    def abort(self, txn: RunningTransaction) -> ResourceResult:
        self.discard_ahead()
        return super().abort(txn)

    def prefill(self, handle: SequenceHandle, max_tokens: int, mask: Any | None = None) -> PendingBatch | None:
        self.discard_ahead()
        seq = self.sequence(handle)
        n = len(seq.prompt)
        start, end = seq.frontier, prefill_end(seq, max_tokens)
        inner = capture_cuts(seq, start, end)
        grow(self, seq, end)
        logits = self.executor.prefill(seq, start, end, inner)  # one model call, the inner captures filled
        seq.tokens.extend(seq.prompt[start:end])
        capture_filled(self, seq, inner)
        capture_due(self, seq)
        if end < n:
            return None
        first = ahead_step.drawn_row(handle, n, self.executor.draw_first(seq, logits, mask))
        return PendingBatch(BatchKind.PREFILL, (first,), self.resource_revision)

    def decode(self, handles: Sequence[SequenceHandle], masks: Sequence[Any | None] | None = None,
               prefill: PrefillChunk | None = None) -> PendingBatch:
        if masks is not None and len(masks) != len(handles):
            raise EngineFailure(f"{len(masks)} masks for {len(handles)} decode rows")
        if self._ahead is not None and ahead_step.matches(self._ahead, handles, masks, prefill):
            ahead, self._ahead = self._ahead, None
            self.ahead_adopted += 1
            self._chained = Chained.launch(self, ahead)  # queued before this step's draws are waited for
            self.ahead_chained += self._chained is not None
            self.ahead_launched += self._chained is not None
            return ahead.started.finish()
        self.discard_ahead()
        seqs = [self.sequence(h) for h in handles]
        if any(s.pending is None for s in seqs):
            raise EngineFailure("decode of a sequence before its prompt finished")
        if prefill is not None:
            return mixed_round(self, seqs, masks or [None] * len(seqs), prefill)
        return ahead_step.start(self, seqs, masks or [None] * len(seqs)).finish()

    def control(self, handle: SequenceHandle, tokens: Sequence[int]) -> PendingBatch:
        """Forced tokens: no sampling, no RNG position consumed beyond the tokens themselves."""
        self.discard_ahead()
        seq = self.sequence(handle)
        if not tokens or seq.pending is None:
            raise EngineFailure(f"control of {handle} needs a finished prompt and a non-empty suffix")
        fed = (seq.pending,) + tuple(tokens[:-1])
        self.store.copy_slot(handle.slot, self.config.backup_slot(seq.row))
        grown = grow(self, seq, seq.frontier + len(fed))
        self.executor.feed(seq, fed)
        row = PendingRow(handle, tuple(tokens), seq.frontier + 1)
        return PendingBatch(BatchKind.CONTROL, (row,), self.resource_revision, payload=(Provisional(fed, grown),))

    def commit(self, batch: PendingBatch, decisions: Sequence[RowDecision]) -> None:
        """Validate every row first, then apply: the batch is committed whole or not at all. The step chained
        behind it survives only a commit that keeps every row going: it then becomes the round launched ahead."""
        seqs = validate_commit(self, batch, decisions)  # touches nothing: a refused commit leaves all in flight
        chained, self._chained = self._chained, None
        self.discard_ahead()  # never one here (it is launched after a commit); a misuse must not keep it
        if chained is not None and not chained.follows(batch, decisions):
            chained.discard(self)  # before this commit restores any row from its own backup
            chained = None
        counted, replays = [], []
        for seq, d, prov in zip(seqs, decisions, provisionals(batch)):
            if d.accepted == 0:
                if prov is not None:
                    restore(self, seq, prov)
            # only a speculative block is cut (fed: the pending token, then the drafts or forced tokens but the
            # last); a forced suffix commits whole, a first-token row holds nothing provisional
            elif prov is not None and d.accepted < len(prov.fed):
                kept = rollback(self, seq, prov, d.accepted)
                if kept:
                    replays.append((seq, kept))
        replay(self, [s for s, _ in replays], [k for _, k in replays])  # at the frontiers before this commit
        for seq, row, d, prov in zip(seqs, batch.rows, decisions, provisionals(batch)):
            if d.accepted == 0:
                continue
            counted.append((seq.row, seq.handle, row.tokens[:d.accepted]))
            if prov is not None:
                seq.tokens.extend(prov.fed[:d.accepted])
            seq.pending = row.tokens[d.accepted - 1]
        self.executor.record(counted)  # the accepted tokens are outputs now: the penalties' history follows
        if chained is not None:
            self._ahead = chained.promote(self)

    def abort_pending(self, batch: PendingBatch) -> None:
        """Every row back to its committed state: first-token rows hold nothing provisional, stepped rows are
        restored."""
        self.discard_ahead()
        if batch.payload is None and batch.kind is not BatchKind.PREFILL:
            return  # a batch without its provisional state is refused by commit too; nothing to restore here
        for row, prov in zip(batch.rows, provisionals(batch)):
            if prov is not None:
                restore(self, self.sequence(row.handle), prov)

