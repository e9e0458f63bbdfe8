"""The pieces of the model transactions (`program.py`): where a prefill chunk ends and is cut, the pages a step
takes and gives back, snapshots of the frontier (chunk boundary and prompt end), and the validation that makes a
commit whole or nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ninfer.contracts import BatchKind, EngineFailure, PendingBatch, RowDecision, token_digest

from .records import ActiveSequence, Checkpoint

if TYPE_CHECKING:
    from .core import ProgramCore

CHUNK = 64  # the GDN chunk: boundary checkpoints sit at its absolute multiples


@dataclass(frozen=True)
class Provisional:
    """One decode/control row's step: the tokens it fed after the frontier and the pages it took for them."""

    fed: tuple[int, ...]
    grown: tuple[int, ...]


# ---- prefill -------------------------------------------------------------------------------------------------
def prefill_end(seq: ActiveSequence, max_tokens: int) -> int:
    """Where a prefill chunk of at most `max_tokens` from the frontier ends; EngineFailure when there is nothing to
    prefill (the Engine asked for a chunk of a consumed prompt, or for an empty one)."""
    n = len(seq.prompt)
    if seq.frontier >= n or max_tokens < 1:
        raise EngineFailure(f"prefill of {seq.handle}: frontier {seq.frontier} of a {n}-token prompt, chunk "
                            f"{max_tokens}")
    return min(n, seq.frontier + max_tokens)


def boundary_cut(prog: "ProgramCore", seq: ActiveSequence, start: int, end: int) -> int | None:
    """The deepest multiple of 64 in (start, end] short of the prompt end, when a boundary snapshot will be taken
    there. One per chunk, not one per boundary: a cut inside the chunk is another model call (a 64-token call uses
    the GPU poorly), and the deepest boundary is the one a later prompt diverging in this chunk reuses the most of."""
    cut = end // CHUNK * CHUNK
    if cut <= start or cut >= len(seq.prompt) or not boundary_wanted(prog, seq.prompt[:cut]):
        return None
    return cut


# ---- pages and backups ---------------------------------------------------------------------------------------
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
    """Undo one provisional step: the committed GDN state from the row's backup slot, the grown pages back to the
    pool and the reservation (positions at and past the frontier may keep provisional K/V, which nothing reads:
    every read is bounded by the context length)."""
    prog.store.copy_slot(prog.config.backup_slot(seq.row), seq.handle.slot)
    for p in reversed(prov.grown):
        assert seq.table.pop() == p, f"{seq.handle}: block table changed under a pending batch"
        prog.alloc.unref(p)
        seq.reserve_left += 1


# ---- snapshots -----------------------------------------------------------------------------------------------
def boundary_wanted(prog: "ProgramCore", tokens: Sequence[int]) -> bool:
    """The checkpoint allowance has a free slot and these tokens are not already published."""
    if prog.boundary_snapshots() >= prog.config.checkpoint_slots or not prog.slots.free:
        return False
    digest = token_digest(tokens)
    return not any(len(c.tokens) == len(tokens) and token_digest(c.tokens) == digest for c in prog.ckpts.values())


def share(prog: "ProgramCore", seq: ActiveSequence, slot: int, boundary: bool) -> None:
    """Snapshot the frontier: GDN state copied into `slot`, every page shared by reference (the partial one too:
    the checkpoint reads only positions before its frontier, and a resume copies it)."""
    prog.store.copy_slot(seq.handle.slot, slot)
    for p in seq.table:
        prog.alloc.ref(p)
    seq.snapshots.append(Checkpoint(tuple(seq.tokens), list(seq.table), slot, boundary=boundary))


def snapshot_prompt_end(prog: "ProgramCore", seq: ActiveSequence) -> None:
    """Capture the prompt-end state into the publication slot reserved at activation."""
    if seq.pub_slot is not None:
        slot, seq.pub_slot = seq.pub_slot, None
        share(prog, seq, slot, boundary=False)


# ---- commit --------------------------------------------------------------------------------------------------
def validate_commit(prog: "ProgramCore", batch: PendingBatch, decisions: Sequence[RowDecision]) -> list[ActiveSequence]:
    """Every row's sequence, after checking them all before anything is touched: a live handle, an unchanged
    frontier, and full acceptance (no speculative backend)."""
    batch.check_decisions(decisions)
    prefill_batch = batch.kind is BatchKind.PREFILL
    if not prefill_batch and (batch.payload is None or len(batch.payload) != len(batch.rows)):
        raise EngineFailure("a decode/control batch lost its provisional state")
    seqs = []
    for row, d in zip(batch.rows, decisions):
        seq = prog.sequence(row.handle)
        expected = seq.frontier if prefill_batch else seq.frontier + 1
        if row.base_frontier != expected or (prefill_batch and seq.pending is not None):
            raise EngineFailure(f"batch row {row.handle} at {row.base_frontier}, sequence expects {expected}")
        if d.accepted and not prefill_batch and d.accepted != row.produced:
            raise EngineFailure("partial acceptance needs a speculative backend; this Program has none")
        seqs.append(seq)
    return seqs
