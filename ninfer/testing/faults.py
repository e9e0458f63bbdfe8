"""FaultyProgram: wraps any Program and raises at a chosen call, to drive the Engine's failure paths."""

from __future__ import annotations

from typing import Any

FAULTABLE = ("plan", "start", "advance", "abort", "prefill", "decode", "control", "commit", "abort_pending",
             "backfill_feasible")


class InjectedFault(RuntimeError):
    """Raised by FaultyProgram; the Engine must turn it into an Engine-wide failure."""


class FaultyProgram:
    def __init__(self, inner: Any):
        self.inner = inner
        self.limits = inner.limits
        self._armed: tuple[str, int] | None = None
        self.calls: dict[str, int] = {}
        self.fired = False
        self.pending_batches = 0  # produced and not yet consumed: sessions must never commit while > 0

    def arm(self, method: str, after: int) -> None:
        """Raise on the `after`-th next call of `method` (0 = the very next one)."""
        if method not in FAULTABLE:
            raise ValueError(f"cannot fault {method!r}; choose from {FAULTABLE}")
        self._armed = (method, self.calls.get(method, 0) + after)

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
            if self._armed == (name, n):
                self._armed, self.fired = None, True
                raise InjectedFault(f"injected fault in {name} call #{n}")
            out = target(*args, **kwargs)
            if name in ("prefill", "decode", "control") and out is not None:
                self.pending_batches += 1
            elif name in ("commit", "abort_pending"):
                self.pending_batches -= 1
            return out

        return call

    def check_no_pending_batch(self) -> None:
        """The commit-order guard: an OutputSession commits only after the Program consumed its batch."""
        if self.pending_batches:
            raise AssertionError("an OutputSession committed while a PendingBatch was still unconsumed")
