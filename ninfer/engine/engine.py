"""The public Engine facade: submit, stream or wait, cancel, availability.

Outstanding capacity is taken at a successful submit and released exactly once, when both facts hold in either
order: `response_done` (the worker formed the final result) and `consumer_released` (the wait ended or the handle
was abandoned). Abandoning a handle sets cancellation and consumer_released; it never calls the Program.
"""

from __future__ import annotations

import itertools
import logging
import queue
import random
import threading
import time
from dataclasses import replace
from typing import Iterator, Sequence

from ninfer.contracts import GenerationResult, Program, RejectReason, RequestRejected
from ninfer.contracts.media import is_placeholder

from .cache_stats import CacheReport
from .config import EngineConfig
from .core import EngineCore
from .records import GenerationRequest, RequestRecord
from .rules import should_release_capacity

log = logging.getLogger("ninfer.engine")

_IDLE_WAIT_S = 0.01  # the worker re-checks deadlines and timeouts at least this often when idle
_CANCEL_WAIT_S = 30.0  # after shutdown cancels, the longest it waits for the worker to end every request


class GenerationHandle:
    def __init__(self, engine: "Engine", rec: RequestRecord):
        self._engine, self._rec = engine, rec
        self.request_id = rec.rid
        self._done = False

    def events(self, timeout: float | None = None) -> Iterator[object]:
        """GenerationStart, OutputDelta..., then the GenerationResult (always last, always exactly one)."""
        while not self._done:
            try:
                ev = self._rec.events.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"request {self.request_id}: no event within {timeout} s") from None
            if isinstance(ev, GenerationResult):
                self._done = True
                self._engine._consumer_released(self._rec)
            yield ev

    def result(self, timeout: float | None = None) -> GenerationResult:
        last = None
        for ev in self.events(timeout):
            last = ev
        assert isinstance(last, GenerationResult)
        return last

    def cancel(self) -> None:
        self._rec.cancel_requested = True
        self._engine._wake()

    def close(self) -> None:
        """Abandon the handle: cancel if still running and stop consuming; capacity frees once the worker ends it."""
        if not self._done:
            self._done = True
            self._rec.cancel_requested = True
            self._engine._consumer_released(self._rec)
            self._engine._wake()

    def __enter__(self) -> "GenerationHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Engine:
    def __init__(self, program: Program, config: EngineConfig = EngineConfig(), *, threaded: bool = True,
                 clock=time.monotonic):
        self.config = config
        self.core = EngineCore(program, config, clock=clock)
        self.core.on_finish = self._response_done
        self._clock = clock
        self._lock = threading.Lock()
        self._outstanding = 0
        self._order = itertools.count(1)
        self._rids = itertools.count(1)
        self._seeds = random.Random()
        self._wakeup = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._worker, name="ninfer-engine-core", daemon=True)
            self._thread.start()

    @property
    def available(self) -> bool:
        return self.core.failed is None and self.core.inbox.closed is None

    @property
    def failure(self) -> str | None:
        return self.core.failed

    @property
    def outstanding(self) -> int:
        with self._lock:
            return self._outstanding

    def cache_report(self) -> CacheReport:
        """The context cache's counters and the Program's checkpoint occupancy per tier (any thread may ask)."""
        stats = self.core.resources.stats
        return CacheReport(replace(stats, misses=dict(stats.misses)), self.core.cache_usage)

    def submit(self, request: GenerationRequest) -> GenerationHandle:
        return self.submit_all([request])[0]

    def submit_all(self, requests: Sequence[GenerationRequest]) -> list[GenerationHandle]:
        """Accept every request or none (an API request's n choices, a prompt batch): a refusal takes no
        capacity at all, so a rejected batch never holds room that other clients need until the worker runs."""
        for request in requests:
            self._validate(request)
        now = self._clock()
        with self._lock:
            if self._outstanding + len(requests) > self.config.max_outstanding:
                raise RequestRejected(RejectReason.OVERLOADED, f"{self._outstanding} requests outstanding, "
                                      f"{len(requests)} more asked for (limit {self.config.max_outstanding})")
            recs = []
            for request in requests:
                seed = request.seed if request.seed is not None else self._seeds.getrandbits(63)
                recs.append(RequestRecord(next(self._rids), request, next(self._order), now, seed))
            # Accepted only if the inbox takes them: a failure or shutdown closes the inbox atomically, and what it
            # holds then still gets its terminal event from the worker or the failure cleanup.
            closed = self.core.inbox.put_all(recs)
            if closed is not None:
                raise RequestRejected(RejectReason.ENGINE_UNAVAILABLE, closed)
            self._outstanding += len(recs)
        self._wake()
        return [GenerationHandle(self, rec) for rec in recs]

    def _validate(self, request: GenerationRequest) -> None:
        limits = self.core.program.limits
        if not request.prompt:
            raise RequestRejected(RejectReason.UNREPRESENTABLE, "the prompt has no tokens")
        if request.max_tokens < 1:
            raise RequestRejected(RejectReason.UNREPRESENTABLE, f"max_tokens must be >= 1, got {request.max_tokens}")
        if request.media is not None:
            if limits.no_vision is not None:
                raise RequestRejected(RejectReason.UNREPRESENTABLE, f"the prompt has images; {limits.no_vision}")
            wrong = request.media.check(request.prompt)
            if wrong is not None:
                raise RequestRejected(RejectReason.UNREPRESENTABLE, f"the prompt's images: {wrong}")
        bad = [t for t in request.prompt if not 0 <= t < limits.vocab_size
               and not (request.media is not None and is_placeholder(t))]
        if bad:
            raise RequestRejected(RejectReason.UNREPRESENTABLE, f"token id {bad[0]} outside the vocabulary")
        need = len(request.prompt) + request.max_tokens
        if need > limits.max_context:
            raise RequestRejected(RejectReason.CONTEXT_TOO_LONG, f"prompt ({len(request.prompt)}) + max_tokens "
                                  f"({request.max_tokens}) = {need} exceeds the context of {limits.max_context}")

    def _response_done(self, rec: RequestRecord) -> None:
        rec.response_done = True
        self._maybe_release(rec)

    def _consumer_released(self, rec: RequestRecord) -> None:
        rec.consumer_released = True
        self._maybe_release(rec)

    def _maybe_release(self, rec: RequestRecord) -> None:
        with rec.lock:
            release = should_release_capacity(rec.response_done, rec.consumer_released, rec.capacity_released)
            if release:
                rec.capacity_released = True
        if release:
            with self._lock:
                self._outstanding -= 1

    def step(self) -> bool:
        """Run one worker boundary on the caller's thread (only for an Engine built with threaded=False)."""
        assert self._thread is None, "step() drives an unthreaded Engine only"
        return self.core.boundary()

    def run_until_idle(self, max_boundaries: int = 100_000) -> int:
        for n in range(max_boundaries):
            if not self.step() and not len(self.core.inbox):
                return n
        raise RuntimeError(f"engine still busy after {max_boundaries} boundaries")

    def _wake(self) -> None:
        self._wakeup.set()

    def _worker(self) -> None:
        while not self._stop:
            worked = self.core.boundary()
            if not worked:
                self._wakeup.wait(_IDLE_WAIT_S)
                self._wakeup.clear()

    def shutdown(self, timeout: float = 0.0) -> None:
        """Stop admitting; let the requests already accepted (waiting or active) finish for up to `timeout`
        seconds; then cancel the rest through the ordinary cancellation paths, so every request gets its one
        terminal event and the Program's state is released; then stop the worker. Idempotent."""
        self.core.inbox.close("engine is shutting down")
        if not self._drain(timeout):
            self.core.cancel_all = True
            self._wake()
            if not self._drain(_CANCEL_WAIT_S):
                log.error("engine shutdown: %d requests still open after cancelling them", len(self.core.records))
        self._stop = True
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=_CANCEL_WAIT_S)

    def _drain(self, timeout: float) -> bool:
        """True once the worker ended every accepted request (it stops early on an Engine failure, which ends
        them all); an unthreaded Engine runs its boundaries here."""
        end = time.monotonic() + timeout
        while self.core.records or len(self.core.inbox):
            if self.core.failed is not None:
                return True
            if self._thread is None:
                self.step()
            else:
                self._wakeup.set()
                time.sleep(_IDLE_WAIT_S)
            if time.monotonic() >= end:
                return not (self.core.records or len(self.core.inbox))
        return True
