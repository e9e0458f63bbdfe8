"""A decode round carrying one prompt's prefill chunk (`Program.decode(..., prefill=)`): the MIXED batch.

The chunk is consumed as `Program.prefill` would consume it (prompt tokens are not provisional: its KV and GDN
state are written at once, its captures filled) and the decode rows step as in a plain round (backed up, their
pages provisional). An executor with a `mixed_launch` call runs both in one model pass, every weight read once for the
chunk's tokens and the decode rows together; without one (or when a speculative backend runs the round), the chunk
runs first and the round after it: the same state and the same draws, two passes. The batch holds the decode rows
and, when the chunk finished its prompt, the first-token row last, which has no provisional part (payload None).

A round launched ahead (`launch_riding`, async scheduling) may carry a chunk that leaves prompt tokens: until its
`finish` the chunk is provisional like the rows (the rider's state backed up into its own row's backup slot, free
while it prefills; its pages provisional; its tokens and captures recorded only by `finish`), so the next boundary
sizes the same chunk from the same frontier and adopts the round, and a discard restores the rider as a row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from ninfer.contracts import BatchKind, EngineFailure, PendingBatch, PendingRow, PrefillChunk

from . import ahead as ahead_step
from .execution import Provisional, capture_cuts, capture_due, capture_filled, grow, prefill_end
from .records import ActiveSequence

if TYPE_CHECKING:
    from .program import Program


def mixed_round(prog: "Program", seqs: Sequence[ActiveSequence], masks: Sequence[Any | None],
                chunk: PrefillChunk) -> PendingBatch:
    """Step `seqs` and consume `chunk` in one unit; the MIXED batch."""
    pseq, start, end, inner = _chunk_of(prog, seqs, chunk)
    grow(prog, pseq, end)
    provisional, collect, logits = _pass(prog, seqs, masks, pseq, start, end, inner)
    rows = collect()
    _record(prog, pseq, start, end, inner)
    payload = provisional
    n = len(pseq.prompt)
    if end == n:  # drawn after the decode rows' draws were read: the sampler's workspace is free again
        rows += (ahead_step.drawn_row(chunk.handle, n, prog.executor.draw_first(pseq, logits, chunk.mask)),)
        payload += (None,)
    return PendingBatch(BatchKind.MIXED, tuple(rows), prog.resource_revision, payload=tuple(payload))


def launch_riding(prog: "Program", seqs: Sequence[ActiveSequence], chunk: PrefillChunk
                  ) -> tuple[ahead_step.Started, Provisional]:
    """Start the unmasked round of `seqs` carrying `chunk` (one that leaves prompt tokens), the chunk provisional
    until `finish` (module docstring). Returns the started round, whose `finish` records the chunk and returns the
    MIXED batch of the rows, and the rider's provisional part (fed: the chunk's tokens), for a discard."""
    pseq, start, end, inner = _chunk_of(prog, seqs, chunk)
    if chunk.mask is not None or end >= len(pseq.prompt):
        raise EngineFailure(f"a round launched ahead carries only an unmasked chunk that leaves prompt tokens "
                            f"({chunk.handle})")
    prog.store.copy_slot(pseq.handle.slot, prog.config.backup_slot(pseq.row))
    rider = Provisional(tuple(pseq.prompt[start:end]), grow(prog, pseq, end))
    provisional, collect, _ = _pass(prog, seqs, [None] * len(seqs), pseq, start, end, inner)

    def finish() -> PendingBatch:
        rows = collect()
        _record(prog, pseq, start, end, inner)  # the chunk is consumed now
        return PendingBatch(BatchKind.MIXED, rows, prog.resource_revision, payload=provisional)
    return ahead_step.Started(provisional, finish), rider


def _chunk_of(prog: "Program", seqs: Sequence[ActiveSequence], chunk: PrefillChunk
              ) -> tuple[ActiveSequence, int, int, list[tuple[int, int]]]:
    """The riding sequence, where its chunk starts and ends, and the captures inside it; EngineFailure for a chunk
    of one of the rows or beside none."""
    pseq = prog.sequence(chunk.handle)
    if not seqs or any(s.handle == chunk.handle for s in seqs):
        raise EngineFailure(f"a decode round carrying {chunk.handle}'s prefill needs other rows to decode")
    start, end = pseq.frontier, prefill_end(pseq, chunk.max_tokens)
    return pseq, start, end, capture_cuts(pseq, start, end)


def _pass(prog: "Program", seqs: Sequence[ActiveSequence], masks: Sequence[Any | None], pseq: ActiveSequence,
          start: int, end: int, inner: list[tuple[int, int]]
          ) -> tuple[tuple[Provisional, ...], Callable[[], tuple[PendingRow, ...]], Any]:
    """The rows' step and the chunk's prefill queued (the chunk's pages already taken): the rows' provisional
    parts, the call that waits for their draws and returns their rows, and what `prefill` returns for the chunk.
    One model pass where the executor has `mixed_launch` and no backend runs; else the chunk, then the round."""
    one_pass = getattr(prog.executor, "mixed_launch", None)
    if one_pass is None or prog.config.draft_tokens:
        logits = prog.executor.prefill(pseq, start, end, inner)
        started = ahead_step.start(prog, seqs, masks)
        return started.provisional, lambda: started.finish().rows, logits
    provisional = tuple(Provisional((s.pending,), grow(prog, s, s.frontier + 1)) for s in seqs)
    drawn, logits = one_pass(seqs, masks, pseq, start, end, inner)
    return provisional, lambda: tuple(ahead_step.drawn_row(s.handle, s.frontier + 1, d)
                                      for s, d in zip(seqs, drawn())), logits


def _record(prog: "Program", pseq: ActiveSequence, start: int, end: int, inner: list[tuple[int, int]]) -> None:
    """The chunk's tokens consumed, as `prefill` records them: the captures filled inside it and one due at its
    end."""
    pseq.tokens.extend(pseq.prompt[start:end])
    capture_filled(prog, pseq, inner)
    capture_due(prog, pseq)
