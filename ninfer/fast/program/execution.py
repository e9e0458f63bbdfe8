"""Model transactions of the fast Program: staged prefill, compact decode, forced control, and the accepted-prefix
commit, over FastModel's pools.

Prompt tokens are not provisional: a prefill chunk writes KV and GDN state at once (cut at most once, at the
deepest absolute multiple of 64 inside it, whose state becomes a boundary checkpoint), and the final chunk's batch
holds only the sampled first token. Decode and control run on the live slot: the GDN step updates the state slot
in place, so the decode graph first copies each row's committed state into the backup slot bound to its block-table
row (``FastModel.backup_slots``, inside the graph; control copies it eagerly). Commit keeps the stepped state; a
rejected row (cancelled, or the whole batch dropped by abort_pending) gets its slot back from the backup and returns
the pages the step took. Positions at and past the frontier may hold provisional K/V: every read is bounded by the
context length, so they are never seen before being overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch

from ninfer.contracts import BatchKind, EngineFailure, PendingBatch, PendingRow, RowDecision, SequenceHandle
from ninfer.fast.sampling import SampleRow
from ninfer.program_core import ActiveSequence
from ninfer.program_core.execution import (boundary_wanted, prefill_end, share, snapshot_prompt_end,
                                            validate_commit)

if TYPE_CHECKING:
    from .program import FastProgram

CHUNK = 64  # the GDN chunk: boundary checkpoints sit at its absolute multiples


@dataclass(frozen=True)
class Provisional:
    """One row's step: the tokens it fed after the frontier and the pages it took for them."""

    fed: tuple[int, ...]
    grown: tuple[int, ...]


# ---- pages -------------------------------------------------------------------------------------------------
def _grow(prog: "FastProgram", seq: ActiveSequence, end: int) -> tuple[int, ...]:
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


def _restore(prog: "FastProgram", seq: ActiveSequence, prov: Provisional) -> None:
    """Undo one provisional step: the committed GDN state from the row's backup slot, the grown pages back to the
    pool and the reservation (the device row keeps stale entries past the table, which nothing reads)."""
    prog.store.copy_slot(prog.config.backup_slot(seq.row), seq.handle.slot)
    for p in reversed(prov.grown):
        assert seq.table.pop() == p, f"{seq.handle}: block table changed under a pending batch"
        prog.alloc.unref(p)
        seq.reserve_left += 1


# ---- sampling ------------------------------------------------------------------------------------------------
def _sample_rows(seqs: Sequence[ActiveSequence], masks: Sequence[Any | None]) -> list[SampleRow]:
    """One device draw per sequence at its next position (the pending token, if any, is consumed first)."""
    return [SampleRow(s.params, s.seed, s.frontier + (s.pending is not None), s.row, s.handle, s.num_outputs, s, m)
            for s, m in zip(seqs, masks)]


# ---- prefill -------------------------------------------------------------------------------------------------
def _boundary_cut(prog: "FastProgram", seq: ActiveSequence, start: int, end: int) -> int | None:
    """The deepest multiple of 64 in (start, end] short of the prompt end, when a boundary snapshot will be taken
    there. One per chunk, not one per boundary: a cut inside the chunk is another model call (a 64-token call uses
    the GPU poorly), and the deepest boundary is the one a later prompt diverging in this chunk reuses the most of."""
    cut = end // CHUNK * CHUNK
    if cut <= start or cut >= len(seq.prompt) or not boundary_wanted(prog, seq.prompt[:cut]):
        return None
    return cut


def prefill(prog: "FastProgram", handle: SequenceHandle, max_tokens: int, mask: Any | None) -> PendingBatch | None:
    seq = prog.sequence(handle)
    n = len(seq.prompt)
    end = prefill_end(seq, max_tokens)
    cut = _boundary_cut(prog, seq, seq.frontier, end)
    for a, b in [(seq.frontier, cut), (cut, end)] if cut is not None and cut < end else [(seq.frontier, end)]:
        _grow(prog, seq, b)
        tokens = torch.tensor(seq.prompt[a:b], dtype=torch.long, device=prog.device)  # [b - a]
        logits = prog.model.prefill(tokens, handle.slot, seq.row, a)  # [V] fp32, the distribution at b
        seq.tokens.extend(seq.prompt[a:b])
        if b == cut:
            share(prog, seq, prog.slots.take(), boundary=True)
            prog.bump_revision()
    if end < n:
        return None
    ((token, lp),) = prog.sampler.sample(logits[None], _sample_rows([seq], [mask]))  # position n: prompt consumed
    return PendingBatch(BatchKind.PREFILL, (PendingRow.drawn(handle, (token,), n, lp),), prog.resource_revision)


# ---- decode and control --------------------------------------------------------------------------------------
def decode(prog: "FastProgram", handles: Sequence[SequenceHandle],
           masks: Sequence[Any | None] | None) -> PendingBatch:
    if masks is not None and len(masks) != len(handles):
        raise EngineFailure(f"{len(masks)} masks for {len(handles)} decode rows")
    seqs = [prog.sequence(h) for h in handles]
    if any(s.pending is None for s in seqs):
        raise EngineFailure("decode of a sequence before its prompt finished")
    provisional = tuple(Provisional((s.pending,), _grow(prog, s, s.frontier + 1)) for s in seqs)
    pos = [s.frontier for s in seqs]
    variant = prog.sampler.prepare(_sample_rows(seqs, masks or [None] * len(seqs)))  # positions frontier + 1
    prog.runner.run_lists(([s.pending for s in seqs], [s.handle.slot for s in seqs], [s.row for s in seqs],
                           [p + 1 for p in pos], pos), variant=variant)
    # a SamplingError here leaves the step's pages and stepped slots in place with no batch to abort: the Engine
    # fails whole on any escape from a Program call (EngineCore.boundary), so nothing reads them again
    drawn = prog.sampler.collect()
    rows = [PendingRow.drawn(h, (token,), s.frontier + 1, lp) for h, s, (token, lp) in zip(handles, seqs, drawn)]
    return PendingBatch(BatchKind.DECODE, tuple(rows), prog.resource_revision, payload=provisional)


def control(prog: "FastProgram", handle: SequenceHandle, tokens: Sequence[int]) -> PendingBatch:
    """Forced tokens: no sampling, no RNG position consumed beyond the tokens themselves."""
    seq = prog.sequence(handle)
    if not tokens or seq.pending is None:
        raise EngineFailure(f"control of {handle} needs a finished prompt and a non-empty suffix")
    fed = (seq.pending,) + tuple(tokens[:-1])
    prog.store.copy_slot(handle.slot, prog.config.backup_slot(seq.row))
    grown = _grow(prog, seq, seq.frontier + len(fed))
    prog.model.prefill(torch.tensor(fed, dtype=torch.long, device=prog.device), handle.slot, seq.row, seq.frontier)
    row = PendingRow(handle, tuple(tokens), seq.frontier + 1)
    return PendingBatch(BatchKind.CONTROL, (row,), prog.resource_revision, payload=(Provisional(fed, grown),))


# ---- commit ----------------------------------------------------------------------------------------------------
def commit(prog: "FastProgram", batch: PendingBatch, decisions: Sequence[RowDecision]) -> None:
    """Validate every row first, then apply: the batch is committed whole or not at all."""
    seqs = validate_commit(prog, batch, decisions)
    prefill_batch = batch.kind is BatchKind.PREFILL
    counted = []
    for i, (seq, row, d) in enumerate(zip(seqs, batch.rows, decisions)):
        if d.accepted == 0:
            if not prefill_batch:
                _restore(prog, seq, batch.payload[i])
            continue
        counted.append((seq.row, seq.handle, row.tokens[:d.accepted]))
        if not prefill_batch:
            seq.tokens.extend(batch.payload[i].fed)
        seq.pending = row.tokens[d.accepted - 1]
        if d.boundary is not None:
            seq.boundary = row.base_frontier + d.boundary
        if prefill_batch:
            snapshot_prompt_end(prog, seq)
    prog.sampler.record(counted)  # the accepted tokens are outputs now: the penalties' counts follow


def abort_pending(prog: "FastProgram", batch: PendingBatch) -> None:
    """Every row back to its committed state: prefill rows hold nothing provisional, stepped rows are restored."""
    if batch.kind is BatchKind.PREFILL or batch.payload is None:
        return
    for row, prov in zip(batch.rows, batch.payload):
        _restore(prog, prog.sequence(row.handle), prov)
