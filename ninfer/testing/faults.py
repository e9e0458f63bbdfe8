"""FaultyProgram: wraps any Program to drive the Engine's failure paths, and lets a ProgramWatch see every call.

A fault is armed on the n-th next call of one method, in one of three modes:

- `raise`: raise InjectedFault before the call (nothing changed in the Program);
- `raise_after`: run the call, then raise (the Program has mutated, the Engine never sees the value);
- `corrupt`: run the call and hand back a corrupted value: a batch with a row too many or too few, a row naming
  another sequence, a resource result for a stale transaction id, of the wrong kind, releasing an unknown
  checkpoint, publishing a checkpoint twice, a successful materialization without a sequence, a shortfall
  reported after the plan was sealed and started.

After a `raise` fault the Engine must fail with InjectedFault; after a corruption it must detect the value and
fail with a typed EngineFailure, never proceed on it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ninfer.contracts import (CheckpointId, PendingBatch, PendingRow, ResourceResult, SequenceHandle,
                              TransitionKind)

FAULTABLE = ("plan", "start", "advance", "abort", "prefill", "decode", "control", "commit", "abort_pending",
             "backfill_feasible")
MODES = ("raise", "raise_after", "corrupt")
_BATCHES = ("prefill", "decode", "control")


class InjectedFault(RuntimeError):
    """Raised by FaultyProgram; the Engine must turn it into an Engine-wide failure."""


def _corrupt_batch(batch: PendingBatch, variant: int) -> PendingBatch:
    rows = batch.rows
    if variant == 0 and len(rows) > 1:  # a row too few
        rows = rows[:-1]
    elif variant == 1:  # a row naming another (stale) sequence
        first = rows[0]
        rows = (dataclasses.replace(first, handle=SequenceHandle(first.handle.slot, first.handle.generation + 997)),
                ) + rows[1:]
    else:  # a row too many
        stray = PendingRow(SequenceHandle(10_000 + len(rows), 1), rows[0].tokens, rows[0].base_frontier)
        rows = rows + (stray,)
    return PendingBatch(batch.kind, rows, batch.resource_revision, batch.payload)


def _corrupt_result(result: ResourceResult, variant: int) -> ResourceResult | None:
    """The corrupted result, or None when this variant does not apply to this result (the next one is tried)."""
    materialized = result.kind is TransitionKind.MATERIALIZE and result.succeeded
    if variant == 0:
        return dataclasses.replace(result, txn_id=result.txn_id + 7919)  # a stale transaction id
    if variant == 1:
        return dataclasses.replace(result, released=result.released + (CheckpointId(10**9 + 7),))  # unknown
    if variant == 2:  # published twice
        return dataclasses.replace(result, published=result.published * 2) if result.published else None
    if variant == 3:  # a sequence that does not exist
        return dataclasses.replace(result, handle=None) if materialized else None
    if variant == 4:  # a shortfall after the plan was sealed and started
        return dataclasses.replace(result, succeeded=False, handle=None) if materialized else None
    other = TransitionKind.DELETE if result.kind is not TransitionKind.DELETE else TransitionKind.CAPTURE
    return dataclasses.replace(result, kind=other)  # the result of another transition


class FaultyProgram:
    def __init__(self, inner: Any, watch: Any = None):
        self.inner = inner
        self.limits = inner.limits
        self.watch = watch  # ninfer.testing.watch.ProgramWatch, or None
        self._armed: tuple[str, int, str, int] | None = None
        self.calls: dict[str, int] = {}
        self.fired: str | None = None  # the mode of the fault that fired
        self.pending_batches = 0  # produced and not yet consumed: sessions must never commit while > 0

    def arm(self, method: str, after: int, mode: str = "raise", variant: int = 0) -> None:
        """Fault the `after`-th next call of `method` (0 = the very next one)."""
        if method not in FAULTABLE or mode not in MODES:
            raise ValueError(f"cannot fault {method!r} with {mode!r}; choose from {FAULTABLE} x {MODES}")
        self._armed = (method, self.calls.get(method, 0) + after, mode, variant)

    def disarm(self) -> None:
        self._armed = None

    @property
    def resource_revision(self) -> int:
        return self.inner.resource_revision

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if name not in FAULTABLE:
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            n = self.calls.get(name, 0)
            self.calls[name] = n + 1
            if name in ("commit", "abort_pending"):
                self.pending_batches -= 1  # handed over: from here on its fate is the Program's, raise or not
            fault = None
            if self._armed is not None and self._armed[:2] == (name, n):
                fault, self._armed = self._armed, None
            if fault is not None and fault[2] == "raise":
                self.fired = "raise"
                if self.watch is not None:
                    self.watch.stop_checking()
                raise InjectedFault(f"injected fault in {name} call #{n}")
            if self.watch is not None:
                self.watch.before(name, args)
            out = target(*args, **kwargs)
            self._count_batches(name, out)
            if fault is not None:
                out = self._fire(name, n, out, fault)
            if self.watch is not None:
                self.watch.after(name, args, out)
            return out

        return call

    def _count_batches(self, name: str, out: Any) -> None:
        if name in _BATCHES and out is not None:
            self.pending_batches += 1

    def _fire(self, name: str, n: int, out: Any, fault: tuple[str, int, str, int]) -> Any:
        mode, variant = fault[2], fault[3]
        if mode == "raise_after":
            self.fired = "raise"
            if self.watch is not None:
                self.watch.stop_checking()
            if name in _BATCHES and out is not None:
                self.pending_batches -= 1  # the Engine never sees this batch: it is lost with the Program
            raise InjectedFault(f"injected fault after {name} call #{n} mutated the Program")
        corrupt: Callable[[Any, int], Any] | None = None
        if name in _BATCHES and isinstance(out, PendingBatch):
            corrupt = _corrupt_batch
        elif name in ("advance", "abort") and isinstance(out, ResourceResult):
            corrupt = _corrupt_result
        bad = None if corrupt is None else corrupt(out, variant)
        if bad is None:
            self._armed = (name, n + 1, mode, variant)  # nothing to corrupt in this value: try the next call
            return out
        self.fired = "corrupt"
        if self.watch is not None:
            self.watch.stop_checking()
        return bad

    def check_no_pending_batch(self) -> None:
        """The commit-order guard: an OutputSession commits only after the Program consumed its batch."""
        if self.pending_batches:
            raise AssertionError("an OutputSession committed while a PendingBatch was still unconsumed")
