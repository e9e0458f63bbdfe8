"""The parts of the model transactions both Programs share: snapshots of the frontier (chunk boundary and prompt
end) and the validation that makes a commit whole or nothing. The model calls themselves stay in each Program."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from ninfer.contracts import BatchKind, EngineFailure, PendingBatch, RowDecision, token_digest

from .records import ActiveSequence, Checkpoint

if TYPE_CHECKING:
    from .core import ProgramCore


# ---- prefill -------------------------------------------------------------------------------------------------
def prefill_end(seq: ActiveSequence, max_tokens: int) -> int:
    """Where a prefill chunk of at most `max_tokens` from the frontier ends; EngineFailure when there is nothing to
    prefill (the Engine asked for a chunk of a consumed prompt, or for an empty one)."""
    n = len(seq.prompt)
    if seq.frontier >= n or max_tokens < 1:
        raise EngineFailure(f"prefill of {seq.handle}: frontier {seq.frontier} of a {n}-token prompt, chunk "
                            f"{max_tokens}")
    return min(n, seq.frontier + max_tokens)


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
def validate_commit(prog: "ProgramCore", batch: PendingBatch, decisions: Sequence[RowDecision],
                    check_accepted: Callable[[ActiveSequence, int], None] | None = None) -> list[ActiveSequence]:
    """Every row's sequence, after checking them all before anything is touched: a live handle, an unchanged
    frontier, full acceptance (no speculative backend), and `check_accepted(seq, i)` for each accepted
    decode/control row (the reference Program checks its reservation room there)."""
    batch.check_decisions(decisions)
    prefill_batch = batch.kind is BatchKind.PREFILL
    if not prefill_batch and (batch.payload is None or len(batch.payload) != len(batch.rows)):
        raise EngineFailure("a decode/control batch lost its provisional state")
    seqs = []
    for i, (row, d) in enumerate(zip(batch.rows, decisions)):
        seq = prog.sequence(row.handle)
        expected = seq.frontier if prefill_batch else seq.frontier + 1
        if row.base_frontier != expected or (prefill_batch and seq.pending is not None):
            raise EngineFailure(f"batch row {row.handle} at {row.base_frontier}, sequence expects {expected}")
        if d.accepted and not prefill_batch:
            if d.accepted != row.produced:
                raise EngineFailure("partial acceptance needs a speculative backend; this Program has none")
            if check_accepted is not None:
                check_accepted(seq, i)
        seqs.append(seq)
    return seqs
