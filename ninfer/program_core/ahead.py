"""A decode round started on the executor, and the round launched ahead (async scheduling, docs/engine.md "Async
scheduling"): host/GPU overlap.

`start` queues one round of decode-ready rows, a plain step or, when a backend runs, a speculative round
(`speculation.launch_round`): its provisional part happens at once (backup of each row's committed state, the pages
the round takes, the model passes and the device draws or acceptance), and `Started.finish` waits for the results
and builds the round's PendingBatch. `Program.decode` finishes a round at once.

Right after the Engine commits a decode round whose rows all continue, it may call `Program.launch_ahead` with the
round it expects next. The Program then starts that round unmasked and holds it, not a PendingBatch: the host goes
on with the session commits, publication and the next boundary while the device computes. The next `decode` with
exactly those handles and no masks adopts it (its `finish` is the only wait); any other mutating call first
discards it: every row's slot comes back from the backup slot (which the launched round itself filled with the
committed state) and the grown pages return to the reservation, the same restore a cancelled row of a PendingBatch
gets. So nothing launched ahead is ever visible: it becomes a PendingBatch only when `decode` is called for it, and
a row the Engine ended in between is never in that batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ninfer.contracts import (BatchKind, EngineFailure, PendingBatch, PendingRow, PrefillChunk, RowFailure,
                              SequenceHandle)

from .execution import Provisional, grow, restore
from .records import ActiveSequence
from .speculation import launch_round

if TYPE_CHECKING:
    from .program import Program


@dataclass(frozen=True)
class Started:
    """A decode round queued on the executor: its rows' provisional state, and the call that waits for the device's
    results and returns the round's PendingBatch (called once)."""

    provisional: tuple[Provisional, ...]
    finish: Callable[[], PendingBatch]


@dataclass(frozen=True)
class Ahead:
    """One round launched ahead: its rows and the started round; with a prefill chunk riding in it (a mixed unit,
    `mixed.launch_riding`), the chunk and the rider's provisional part."""

    handles: tuple[SequenceHandle, ...]
    started: Started
    chunk: PrefillChunk | None = None
    rider: Provisional | None = None

    @property
    def provisional(self) -> tuple[Provisional, ...]:
        return self.started.provisional


def start(prog: "Program", seqs: Sequence[ActiveSequence], masks: Sequence[Any | None]) -> Started:
    """Queue the next round of `seqs` (past their prompts): a speculative round when the Program drafts, else the
    plain step with each row's grammar mask."""
    if prog.config.draft_tokens:
        provisional, finish = launch_round(prog, seqs, masks)
        return Started(provisional, finish)
    provisional = tuple(Provisional((s.pending,), grow(prog, s, s.frontier + 1)) for s in seqs)
    queue = getattr(prog.executor, "launch", None)
    if queue is None:  # an executor without a device queue runs the step now; the draws wait on the host
        drawn = prog.executor.decode(seqs, masks)
        collect: Callable[[], list[Any]] = lambda: drawn  # noqa: E731
    else:
        collect = queue(seqs, masks)

    def finish() -> PendingBatch:
        # a failed row keeps its Provisional: the Engine drops it, and commit restores its slot and pages
        rows = [drawn_row(s.handle, s.frontier + 1, d) for s, d in zip(seqs, collect())]
        return PendingBatch(BatchKind.DECODE, tuple(rows), prog.resource_revision, payload=provisional)
    return Started(provisional, finish)


def launch(prog: "Program", handles: Sequence[SequenceHandle], chunk: PrefillChunk | None = None,
           riding: Callable[..., tuple[Started, Provisional]] | None = None) -> Ahead:
    """Start the round of `handles` now, unmasked, from the committed state, carrying `chunk` through `riding`
    (`mixed.launch_riding`) if given; `decode` adopts it."""
    seqs = [prog.sequence(h) for h in handles]
    if not seqs or len(set(handles)) != len(handles) or any(s.pending is None for s in seqs):
        raise EngineFailure(f"launch ahead of {list(handles)}: rows must be distinct sequences past their prompt")
    if chunk is None:
        return Ahead(tuple(handles), start(prog, seqs, [None] * len(seqs)))
    started, rider = riding(prog, seqs, chunk)
    return Ahead(tuple(handles), started, chunk, rider)


def matches(ahead: Ahead, handles: Sequence[SequenceHandle], masks: Sequence[Any | None] | None,
            chunk: PrefillChunk | None = None) -> bool:
    """The launched round is the one asked for: the same rows in the same order, none of them masked, carrying the
    same chunk (or none)."""
    return tuple(handles) == ahead.handles and (masks is None or all(m is None for m in masks)) and \
        chunk == ahead.chunk


def discard(prog: "Program", ahead: Ahead) -> None:
    """Every row (and a riding chunk's sequence) back to its committed state; the results are never read (the
    device queue orders the restore after the launched round)."""
    for h, prov in zip(ahead.handles, ahead.provisional):
        restore(prog, prog.sequence(h), prov)
    if ahead.chunk is not None:
        restore(prog, prog.sequence(ahead.chunk.handle), ahead.rider)


def drawn_row(handle: SequenceHandle, base_frontier: int, drawn: Any) -> PendingRow:
    """A drawn (token, logprobs) as a one-token row; a RowFailure as a failed row, whose request ends alone."""
    if isinstance(drawn, RowFailure):
        return PendingRow.failed(handle, base_frontier, drawn)
    token, lp = drawn
    return PendingRow.drawn(handle, (token,), base_frontier, lp)
