"""The bounded worker pool that prepares requests off the event loop: rendering, tokenizing, prefix hashing,
grammar compilation and the Engine submission that follows them.

A preparation waits for a worker in a bounded backlog (beyond it the request gets 429 at once). While it waits or
runs, the request's task watches its client and its deadline: a client that leaves, or a deadline that passes,
ends the wait at once; a preparation that had not started never runs, and one already running finishes on its
thread with its result handed to `discard` (the Engine handles it opened are closed), so it holds no capacity. A
grammar compile it is waiting for in a worker process is killed at once (grammar/workers.py's `cancellable`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Awaitable, Callable, TypeVar

from ninfer.frontend.grammar.workers import cancellable

from .errors import APIError, host_overloaded

T = TypeVar("T")
POLL_S = 0.25  # how often a waiting request looks at its client and deadline


class Preparer:
    def __init__(self, workers: int, backlog: int):
        self.workers, self.backlog = workers, backlog
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ninfer-prepare")
        self._lock = threading.Lock()
        self._pending = 0  # queued plus running preparations

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    async def run(self, fn: Callable[[], T], *, disconnected: Callable[[], Awaitable[bool]] | None = None,
                  deadline: float | None = None, discard: Callable[[T], None] | None = None) -> T:
        """fn() on a worker; raises APIError 429 (backlog full), 499 (client left) or 503 (deadline passed)."""
        with self._lock:
            if self._pending >= self.workers + self.backlog:
                raise APIError(429, f"{self._pending} requests are being prepared (limit "
                               f"{self.workers + self.backlog}); retry later", code="overloaded")
            self._pending += 1
        job = _Job(fn, deadline)
        try:
            future = self._pool.submit(job.run)  # starts a worker thread while the pool has fewer than `workers`
        except RuntimeError as e:  # can't start new thread: the host's overload, not this request's fault
            job.cancel.set()  # the pool queued it before the refused start: a thread already there must not run it
            with self._lock:
                self._pending -= 1
            raise host_overloaded("a preparation thread", e) from None
        future.add_done_callback(self._done)  # also when cancelled before it ran
        try:
            return await self._wait(future, disconnected, deadline)
        except BaseException:
            if not future.cancel():
                job.abandon(discard)
            raise

    def _done(self, _: Future) -> None:
        with self._lock:
            self._pending -= 1

    async def _wait(self, future: Future, disconnected, deadline: float | None):
        wrapped = asyncio.wrap_future(future)
        while True:
            timeout = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            done, _ = await asyncio.wait({wrapped}, timeout=timeout)
            if done:
                return wrapped.result()
            if disconnected is not None and await disconnected():
                raise APIError(499, "client disconnected", code="client_closed")
            if deadline is not None and time.monotonic() > deadline:
                raise _expired()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Job:
    """One preparation, and its hand-off to whoever must discard its result once the request has gone."""

    def __init__(self, fn: Callable[[], T], deadline: float | None):
        self.fn, self.deadline = fn, deadline
        self.lock = threading.Lock()
        self.finished, self.result, self.discard = False, None, None
        self.cancel = threading.Event()  # set once the request went away

    def run(self):
        if self.cancel.is_set():
            return None  # refused at submission (its request has its 503): never started
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _expired()  # it waited for a worker past its deadline: do not start it
        with cancellable(self.cancel):
            result = self.fn()
        with self.lock:
            self.finished, self.result, discard = True, result, self.discard
        if discard is not None:
            discard(result)  # before the pool counts it done: nothing it opened outlives the count
        return result

    def abandon(self, discard: Callable | None) -> None:
        """The request went away while this ran: its grammar compile ends, its result is discarded (if `discard`),
        now or when it arrives."""
        self.cancel.set()
        if discard is None:
            return
        with self.lock:
            ready, self.discard = self.finished, discard
        if ready:
            discard(self.result)


def _expired() -> APIError:
    return APIError(503, "the request timed out before it was prepared (--request-timeout)", code="queue_timeout")
