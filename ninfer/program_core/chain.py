"""A plain decode step launched behind the step just adopted (async scheduling's second step in flight, docs/engine.md
"Async scheduling": the chained step).

When `decode` adopts a round launched ahead, the device would idle from the end of that step until the host has
read its draws, previewed and committed them and launched the next one. So before it waits for those draws the
Program queues the same rows' next step behind it: its tokens are the adopted step's draws on the device (the host
has not read them yet), its positions one past each frontier, and its backups go to the other bank (each row's
chained backup), because the adopted step's backup still holds the committed state its rows may go back to.

It is provisional like a round launched ahead, and invisible: when the Engine commits the adopted batch with every
row accepted and none ending, the chained step becomes the round launched ahead (its fed token is the one just
committed), which the next `decode` of the same rows adopts or any other call discards. When a row was rejected or
ended, or the batch is aborted, it is discarded before that commit touches anything: every row's state after the
adopted step comes back from the chained backups and its pages return to the reservation, then the commit restores
the rejected rows from their own backups. Rows with penalties are never chained (their token counts follow each
commit), nor a row whose adopted step draws its last token by its budget (`max_new`), nor one whose reservation
holds no page for one more position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ninfer.contracts import BatchKind, PendingBatch, RowDecision, SequenceHandle

from .ahead import Ahead, Started, drawn_row
from .execution import Provisional, grow, restore

if TYPE_CHECKING:
    from .program import Program


@dataclass(frozen=True)
class Chained:
    """The step queued behind an adopted round: its rows, the pages it took, its backup bank and the call that
    reads its draws."""

    handles: tuple[SequenceHandle, ...]
    grown: tuple[tuple[int, ...], ...]
    bank: int
    collect: Callable[[], list[Any]]

    @classmethod
    def launch(cls, prog: "Program", ahead: Ahead) -> "Chained | None":
        """Queue the step behind `ahead` (a plain round being adopted, its draws not yet read), or None where it
        cannot be chained: a riding chunk, a speculative backend, an executor without the chained backups, a row
        with penalties or without a reserved page for the next position."""
        executor = prog.executor
        if ahead.chunk is not None or prog.config.draft_tokens or not getattr(executor, "chains", False):
            return None
        seqs = [prog.sequence(h) for h in ahead.handles]
        pages_for = prog.config.pages_for
        # the adopted step's draw is the row's last when it reaches max_new: the row ends at that commit, so a
        # step behind it would only be discarded (and would pass the row's budget)
        if any(s.params.has_penalties or s.num_outputs + 1 >= s.max_new or
               pages_for(s.frontier + 2) - len(s.table) > s.reserve_left for s in seqs):
            return None
        bank = 1 - ahead.provisional[0].bank
        grown = tuple(grow(prog, s, s.frontier + 2) for s in seqs)
        collect = executor.launch(seqs, [None] * len(seqs), bank=bank, behind=True)
        return cls(ahead.handles, grown, bank, collect)

    def follows(self, batch: PendingBatch, decisions: Sequence[RowDecision]) -> bool:
        """Whether the committed batch keeps this step valid: the same plain rows in the same order, every one
        accepted whole and none ending (a row that ends is released at once, which would discard it)."""
        return batch.kind is BatchKind.DECODE and tuple(r.handle for r in batch.rows) == self.handles and \
            all(d.accepted == r.produced and not d.terminal for r, d in zip(batch.rows, decisions))

    def promote(self, prog: "Program") -> Ahead:
        """After the commit of the batch it follows: the round launched ahead it now is (each row fed its pending
        token, the one just committed)."""
        seqs = [prog.sequence(h) for h in self.handles]
        provisional = tuple(Provisional((s.pending,), g, self.bank) for s, g in zip(seqs, self.grown))

        def finish() -> PendingBatch:
            rows = [drawn_row(s.handle, s.frontier + 1, d) for s, d in zip(seqs, self.collect())]
            return PendingBatch(BatchKind.DECODE, tuple(rows), prog.resource_revision, payload=provisional)
        return Ahead(self.handles, Started(provisional, finish))

    def discard(self, prog: "Program") -> None:
        """Every row back to its state after the step it follows (from the chained backups; the device queue orders
        the copies after this step), and its pages back to the reservation; its draws are never read."""
        for h, g in zip(self.handles, self.grown):
            restore(prog, prog.sequence(h), Provisional((), g, self.bank))
