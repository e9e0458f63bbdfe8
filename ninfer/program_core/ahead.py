"""The decode step launched ahead (async scheduling, docs/engine.md "Async scheduling"): host/GPU overlap.

Right after the Engine commits a decode round whose rows all continue, it may call `Program.launch_ahead` with the
round it expects next. The Program then runs that step's provisional part at once (backup of each row's committed
state, the pages the step takes, the model step and the device draw) and holds the launch, not a PendingBatch: the
host goes on with the session commits, publication and the next boundary while the device computes. The next
`decode` with exactly those handles and no masks adopts it (collecting the draws is its only wait); any other
mutating call first discards it: every row's slot comes back from the backup slot (which the launched step itself
filled with the committed state) and the grown pages return to the reservation, the same restore a cancelled row
of a PendingBatch gets. So nothing launched ahead is ever visible: it becomes a PendingBatch only when `decode` is
called for it, and a row the Engine ended in between is never in that batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ninfer.contracts import EngineFailure, SequenceHandle

from .execution import Provisional, grow, restore

if TYPE_CHECKING:
    from .program import Program


@dataclass(frozen=True)
class Ahead:
    """One launched decode step: its rows, their provisional state and the call that waits for the draws."""

    handles: tuple[SequenceHandle, ...]
    provisional: tuple[Provisional, ...]
    collect: Callable[[], list[Any]]


def launch(prog: "Program", handles: Sequence[SequenceHandle]) -> Ahead:
    """Step every row from its committed state now (unmasked); the draws are collected by `take`."""
    seqs = [prog.sequence(h) for h in handles]
    if not seqs or len(set(handles)) != len(handles) or any(s.pending is None for s in seqs):
        raise EngineFailure(f"launch ahead of {list(handles)}: rows must be distinct sequences past their prompt")
    provisional = tuple(Provisional((s.pending,), grow(prog, s, s.frontier + 1)) for s in seqs)
    masks = [None] * len(seqs)
    start = getattr(prog.executor, "launch", None)
    if start is None:  # an executor without a device queue runs the step now; the draws wait on the host
        drawn = prog.executor.decode(seqs, masks)
        return Ahead(tuple(handles), provisional, lambda: drawn)
    return Ahead(tuple(handles), provisional, start(seqs, masks))


def matches(ahead: Ahead, handles: Sequence[SequenceHandle], masks: Sequence[Any | None] | None) -> bool:
    """The launched step is the one asked for: the same rows in the same order, none of them masked."""
    return tuple(handles) == ahead.handles and (masks is None or all(m is None for m in masks))


def discard(prog: "Program", ahead: Ahead) -> None:
    """Every row back to its committed state; the draws are never read (the device queue orders the restore after
    the launched step)."""
    for h, prov in zip(ahead.handles, ahead.provisional):
        restore(prog, prog.sequence(h), prov)
