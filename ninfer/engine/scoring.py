"""CausalScoreCore: the Engine of the CausalScoring purpose (fixed at start, never switched with generation).

It serially calls the Program's `score(tokens, window=, stride=)`: each window runs from a temporary empty state,
so no request record, continuation, checkpoint or cache entry exists and neither the Scheduler nor the
ResourceManager is involved. Callers on many threads queue on one lock; a bounded number may wait, beyond that
`score` says OVERLOADED, as the generation Engine's submit does. An unexpected exception from the Program fails the
core (shared model state can no longer be trusted); a ValueError about the input is the caller's.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol, Sequence

from ninfer.contracts import RejectReason, RequestRejected

log = logging.getLogger("ninfer.engine.scoring")


class Scorer(Protocol):
    def score(self, tokens: Sequence[int], *, window: int, stride: int) -> Any: ...


class CausalScoreCore:
    def __init__(self, scorer: Scorer, *, window: int, stride: int | None = None, max_waiting: int = 16):
        if window < 2:
            raise ValueError(f"scoring window must be >= 2 tokens, got {window}")
        stride = window // 2 if stride is None else stride
        if not 1 <= stride < window:
            raise ValueError(f"scoring stride must be in 1..{window - 1}, got {stride}")
        self.scorer, self.window, self.stride = scorer, window, stride
        self.max_waiting = max_waiting
        self._serial = threading.Lock()  # one score call at a time: the Program's windows are not reentrant
        self._count = threading.Lock()
        self._outstanding = 0
        self._failure: str | None = None
        self._stopped = False
        self.scored_tokens = 0  # tokens scored since start (metrics)

    @property
    def available(self) -> bool:
        return self._failure is None and not self._stopped

    @property
    def failure(self) -> str | None:
        return self._failure

    @property
    def outstanding(self) -> int:
        with self._count:
            return self._outstanding

    def score(self, tokens: Sequence[int], *, vocab_size: int | None = None) -> Any:
        """The Program's score of `tokens` with this core's window and stride (blocks while others score)."""
        tokens = tuple(tokens)
        if not tokens:
            raise RequestRejected(RejectReason.UNREPRESENTABLE, "the text to score has no tokens")
        if vocab_size is not None:
            bad = next((t for t in tokens if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise RequestRejected(RejectReason.UNREPRESENTABLE, f"token id {bad} outside the vocabulary")
        with self._count:
            if not self.available:
                raise RequestRejected(RejectReason.ENGINE_UNAVAILABLE, self._failure or "scoring core is shut down")
            if self._outstanding >= self.max_waiting:
                raise RequestRejected(RejectReason.OVERLOADED, f"{self._outstanding} scoring requests outstanding "
                                      f"(limit {self.max_waiting})")
            self._outstanding += 1
        try:
            with self._serial:
                if not self.available:
                    raise RequestRejected(RejectReason.ENGINE_UNAVAILABLE, self._failure or "scoring core is shut down")
                return self._run(tokens)
        finally:
            with self._count:
                self._outstanding -= 1

    def _run(self, tokens: tuple[int, ...]) -> Any:
        try:
            result = self.scorer.score(tokens, window=self.window, stride=self.stride)
        except ValueError as e:
            raise RequestRejected(RejectReason.UNREPRESENTABLE, str(e)) from None
        except Exception as e:  # noqa: BLE001 - anything else means the Program's state is not trusted any more
            self._failure = f"{type(e).__name__}: {e}"
            log.error("scoring core failed: %s", self._failure, exc_info=e)
            raise RequestRejected(RejectReason.ENGINE_UNAVAILABLE, f"scoring failed: {self._failure}") from None
        self.scored_tokens += len(tokens)
        return result

    def shutdown(self) -> None:
        self._stopped = True
