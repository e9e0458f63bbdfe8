"""Model transactions of the reference Program: staged prefill, compact decode, forced control, and the
accepted-prefix commit.

A sequence's committed state lives in the stores (KV pages by block table, GDN state in its slot). Decode and
control run the model on a private SequenceState assembled from the stores; that state travels in the
PendingBatch payload and reaches the stores only in `commit`, so a dropped batch leaves no trace. Prompt tokens
are not provisional: a prefill chunk writes its state at once, and the final chunk's batch holds only the sampled
first token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch

from ninfer.contracts import BatchKind, EngineFailure, PendingBatch, PendingRow, RowDecision, SequenceHandle
from ninfer.program_core import ActiveSequence
from ninfer.program_core.execution import (boundary_wanted, prefill_end, share, snapshot_prompt_end,
                                            validate_commit)
from ninfer.reference.gdn import CHUNK
from ninfer.reference.state import SequenceState
from ninfer.sampling import draw

if TYPE_CHECKING:
    from .program import ReferenceProgram


@dataclass(frozen=True)
class Provisional:
    """One row's state after consuming `fed` (the pending token, then any forced tokens but the last)."""

    state: SequenceState
    fed: tuple[int, ...]


# ---- state between the stores and the model ----------------------------------------------------------------
def state_of(prog: "ReferenceProgram", seq: ActiveSequence) -> SequenceState:
    """A private SequenceState at the sequence's frontier: its slot's GDN state and its pages' KV."""
    return SequenceState(gdn=prog.slots.load(seq.handle.slot), kv=prog.pages.gather(seq.table, seq.frontier),
                         next_position=seq.frontier, mtp_kv=[])


def _growth(prog: "ReferenceProgram", seq: ActiveSequence, fed: int) -> int:
    """New pages that consuming `fed` more tokens takes from the reservation."""
    grow = prog.config.pages_for(seq.frontier + fed) - len(seq.table)
    if grow > seq.reserve_left:
        raise EngineFailure(f"sequence {seq.handle} would grow past its reservation "
                            f"({grow} pages, {seq.reserve_left} reserved)")
    return grow


def _store(prog: "ReferenceProgram", seq: ActiveSequence, state: SequenceState, fed: Sequence[int]) -> None:
    """Write a state that consumed `fed` after the frontier back into the stores."""
    start, end = seq.frontier, seq.frontier + len(fed)
    if state.next_position != end:
        raise EngineFailure(f"state at {state.next_position}, sequence {seq.handle} expects {end}")
    for _ in range(_growth(prog, seq, len(fed))):
        seq.table.append(prog.alloc.take())
        seq.reserve_left -= 1
    prog.pages.write(seq.table, state.kv, start, end)
    prog.slots.store(seq.handle.slot, state.gdn)
    seq.tokens.extend(fed)


def _sample(prog: "ReferenceProgram", seq: ActiveSequence, logits: torch.Tensor, position: int,
            mask: Any | None) -> tuple[int, tuple | None]:
    """Draw at absolute `position` from fp32 logits [V] (ninfer.sampling.draw)."""
    return draw(logits, seq.params, seq.seed, position, prompt=seq.prompt, outputs=seq.outputs,
                eos_token_ids=prog.limits.eos_token_ids, mask=mask)


# ---- prefill -------------------------------------------------------------------------------------------------
def _segments(start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) cut at absolute multiples of the GDN chunk, so each cut is a chunk boundary of the chunked
    form and the state there is a boundary checkpoint."""
    cuts = [start] + list(range((start // CHUNK + 1) * CHUNK, end, CHUNK)) + [end]
    return list(zip(cuts, cuts[1:]))


def prefill(prog: "ReferenceProgram", handle: SequenceHandle, max_tokens: int, mask: Any | None) -> PendingBatch | None:
    seq = prog.sequence(handle)
    n = len(seq.prompt)
    end = prefill_end(seq, max_tokens)
    state = state_of(prog, seq)
    for a, b in _segments(seq.frontier, end):
        logits = prog.model.prefill(torch.tensor(seq.prompt[a:b]), state)  # [b - a, V]
        _store(prog, seq, state, seq.prompt[a:b])
        if b % CHUNK == 0 and b < n:
            _boundary_snapshot(prog, seq)
    if end < n:
        return None
    token, lp = _sample(prog, seq, logits[-1], n, mask)
    return PendingBatch(BatchKind.PREFILL, (PendingRow.drawn(handle, (token,), n, lp),), prog.resource_revision)


def _boundary_snapshot(prog: "ReferenceProgram", seq: ActiveSequence) -> None:
    """Capture the state at a chunk boundary when the checkpoint allowance has a free slot; skip otherwise, and
    skip a boundary whose tokens are already published."""
    if boundary_wanted(prog, seq.tokens):
        share(prog, seq, prog.slots.take(), boundary=True)
        prog.bump_revision()


# ---- decode and control --------------------------------------------------------------------------------------
def decode(prog: "ReferenceProgram", handles: Sequence[SequenceHandle],
           masks: Sequence[Any | None] | None) -> PendingBatch:
    if masks is not None and len(masks) != len(handles):
        raise EngineFailure(f"{len(masks)} masks for {len(handles)} decode rows")
    rows, provisional = [], []
    for i, handle in enumerate(handles):
        seq = prog.sequence(handle)
        if seq.pending is None:
            raise EngineFailure(f"decode of {handle} before its prompt finished")
        state = state_of(prog, seq)
        logits = prog.model.decode_step(seq.pending, state)  # [V], the distribution at frontier + 1
        token, lp = _sample(prog, seq, logits, seq.frontier + 1, None if masks is None else masks[i])
        rows.append(PendingRow.drawn(handle, (token,), seq.frontier + 1, lp))
        provisional.append(Provisional(state, (seq.pending,)))
    return PendingBatch(BatchKind.DECODE, tuple(rows), prog.resource_revision, payload=tuple(provisional))


def control(prog: "ReferenceProgram", handle: SequenceHandle, tokens: Sequence[int]) -> PendingBatch:
    """Forced tokens: no sampling, no RNG position consumed beyond the tokens themselves."""
    seq = prog.sequence(handle)
    if not tokens or seq.pending is None:
        raise EngineFailure(f"control of {handle} needs a finished prompt and a non-empty suffix")
    fed = (seq.pending,) + tuple(tokens[:-1])
    state = state_of(prog, seq)
    prog.model.prefill(torch.tensor(fed), state)
    row = PendingRow(handle, tuple(tokens), seq.frontier + 1)
    return PendingBatch(BatchKind.CONTROL, (row,), prog.resource_revision, payload=(Provisional(state, fed),))


# ---- commit ----------------------------------------------------------------------------------------------------
def commit(prog: "ReferenceProgram", batch: PendingBatch, decisions: Sequence[RowDecision]) -> None:
    """Validate every row first, then apply: the batch is committed whole or not at all."""
    seqs = validate_commit(prog, batch, decisions,
                           lambda seq, i: _growth(prog, seq, len(batch.payload[i].fed)))
    prefill_batch = batch.kind is BatchKind.PREFILL
    for i, (seq, row, d) in enumerate(zip(seqs, batch.rows, decisions)):
        if d.accepted == 0:
            continue
        if not prefill_batch:
            _store(prog, seq, batch.payload[i].state, batch.payload[i].fed)
        seq.pending = row.tokens[d.accepted - 1]
        if d.boundary is not None:
            seq.boundary = row.base_frontier + d.boundary
        if prefill_batch:
            snapshot_prompt_end(prog, seq)


def abort_pending(prog: "ReferenceProgram", batch: PendingBatch) -> None:
    """Provisional states live only in the batch payload: dropping the batch restores every row."""
