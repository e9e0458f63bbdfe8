"""The pieces of the model transactions (`program.py`): where a prefill chunk ends and is cut, the pages a step
takes and gives back, the captures of the frontiers the ResourceManager chose, and the validation that makes a
commit whole or nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ninfer.contracts import BatchKind, EngineFailure, PendingBatch, RowDecision

from .records import ActiveSequence, Checkpoint

if TYPE_CHECKING:
    from .core import ProgramCore


@dataclass(frozen=True)
class Provisional:
    """One decode/control row's step: the tokens it fed after the frontier, the pages it took for them, and where
    it backed the row's state up (bank 0: the row's backup slot; 1: its chained backup, a step launched behind
    another's, `chain.py`)."""

    fed: tuple[int, ...]
    grown: tuple[int, ...]
    bank: int = 0


def prefill_end(seq: ActiveSequence, max_tokens: int) -> int:
    """Where a prefill chunk of at most `max_tokens` from the frontier ends; EngineFailure when there is nothing to
    prefill (the Engine asked for a chunk of a consumed prompt, or for an empty one)."""
    n = len(seq.prompt)
    if seq.frontier >= n or max_tokens < 1:
        raise EngineFailure(f"prefill of {seq.handle}: frontier {seq.frontier} of a {n}-token prompt, chunk "
                            f"{max_tokens}")
    return min(n, seq.frontier + max_tokens)


def capture_cuts(seq: ActiveSequence, start: int, end: int) -> list[tuple[int, int]]:
    """The reserved captures (frontier, slot) strictly inside a prefill piece [start, end): the executor fills
    their slots within the piece's one model call (one at `end` is the live state after it: `capture_due`)."""
    return [(f, s) for f, s in seq.captures if start < f < end]


def grow(prog: "ProgramCore", seq: ActiveSequence, end: int) -> tuple[int, ...]:
    """Take pages from the reservation until the block table covers positions < end; publish the row."""
    n = prog.config.pages_for(end) - len(seq.table)
    if n > seq.reserve_left:
        raise EngineFailure(f"sequence {seq.handle} would grow past its reservation ({n} pages, "
                            f"{seq.reserve_left} reserved)")
    grown = tuple(prog.alloc.take() for _ in range(max(n, 0)))
    if grown:
        seq.table.extend(grown)
        seq.reserve_left -= len(grown)
        prog.store.write_row(seq.row, seq.table)
    return grown


def restore(prog: "ProgramCore", seq: ActiveSequence, prov: Provisional) -> None:
    """Undo one provisional step: the state before it from the row's backup slot of its bank, the grown pages back to the
    pool and the reservation (positions at and past the frontier may keep provisional K/V, which nothing reads:
    every read is bounded by the context length)."""
    prog.store.copy_slot(prog.backup_slot(seq.row, prov.bank), seq.handle.slot)
    for p in reversed(prov.grown):
        assert seq.table.pop() == p, f"{seq.handle}: block table changed under a pending batch"
        prog.alloc.unref(p)
        seq.reserve_left += 1


def capture_due(prog: "ProgramCore", seq: ActiveSequence) -> None:
    """Capture the frontier when the ResourceManager chose it (a slot was reserved for it at activation): the GDN
    state is copied into that slot and every page is shared by reference (the partial one too: the checkpoint reads
    only positions before its frontier, and a resume copies it)."""
    while seq.captures and seq.captures[0][0] <= seq.frontier:
        frontier, slot = seq.captures.pop(0)
        if frontier != seq.frontier:
            raise EngineFailure(f"{seq.handle}: prefill passed the capture frontier {frontier} (at {seq.frontier})")
        prog.store.copy_slot(seq.handle.slot, slot)
        for p in seq.table:
            prog.alloc.ref(p)
        seq.snapshots.append(Checkpoint(tuple(seq.tokens), list(seq.table), slot))


def capture_filled(prog: "ProgramCore", seq: ActiveSequence, filled: Sequence[tuple[int, int]]) -> None:
    """Record the captures the executor filled inside the prefill piece just consumed (`capture_cuts`): the
    tokens before each frontier, and the pages covering the positions below it shared by reference."""
    for frontier, slot in filled:
        if not seq.captures or seq.captures[0] != (frontier, slot) or frontier > seq.frontier:
            raise EngineFailure(f"{seq.handle}: capture ({frontier}, slot {slot}) filled out of order")
        seq.captures.pop(0)
        table = seq.table[:prog.config.pages_for(frontier)]
        for p in table:
            prog.alloc.ref(p)
        seq.snapshots.append(Checkpoint(tuple(seq.tokens[:frontier]), table, slot))


def provisionals(batch: PendingBatch) -> tuple[Provisional | None, ...]:
    """Each row's provisional step, None for a first-token row (a PREFILL batch's, a MIXED batch's last)."""
    return (None,) * len(batch.rows) if batch.kind is BatchKind.PREFILL else tuple(batch.payload)


def validate_commit(prog: "ProgramCore", batch: PendingBatch, decisions: Sequence[RowDecision]) -> list[ActiveSequence]:
    """Every row's sequence, after checking them all before anything is touched: a live handle, an unchanged
    frontier, and full acceptance of decode rows unless a speculative backend runs (then the Engine's terminal
    rule may cut a block anywhere)."""
    batch.check_decisions(decisions)
    if batch.kind is not BatchKind.PREFILL and (batch.payload is None or len(batch.payload) != len(batch.rows)):
        raise EngineFailure("a decode/control batch lost its provisional state")
    firsts = [p is None for p in provisionals(batch)]
    if batch.kind is not BatchKind.PREFILL and any(firsts) and \
            (batch.kind is not BatchKind.MIXED or firsts.index(True) != len(firsts) - 1):
        raise EngineFailure(f"a {batch.kind.value} batch lost a row's provisional state")
    seqs = []
    for row, d, prefill_row in zip(batch.rows, decisions, firsts):
        seq = prog.sequence(row.handle)
        expected = seq.frontier if prefill_row else seq.frontier + 1
        if row.base_frontier != expected or (prefill_row and seq.pending is not None):
            raise EngineFailure(f"batch row {row.handle} at {row.base_frontier}, sequence expects {expected}")
        if d.accepted and not prefill_row and d.accepted != row.produced and not prog.config.draft_tokens:
            raise EngineFailure("partial acceptance needs a speculative backend; this Program has none")
        seqs.append(seq)
    return seqs
