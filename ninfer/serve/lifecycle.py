"""The server's lifecycle: graceful shutdown on SIGTERM and the exit on an Engine-wide failure.

SIGTERM (or the first Ctrl-C) starts a drain instead of uvicorn's immediate stop: the server keeps its socket, new
requests get 503 `shutting_down` and /health/ready 503, and in-flight requests may finish for
`--shutdown-timeout` seconds. Then whatever still runs is cancelled through its handles: each ends with its
terminal event (a 503 `shutting_down` answer, or an SSE error event then `[DONE]`), and the process exits 0 once
the last response is out (or CANCEL_GRACE_S later). A second signal stops at once.

When the Engine fails, its in-flight requests already have their terminal error events; with
`--exit-on-engine-failure` the server stops admitting, lets those answers out (up to FAILURE_FLUSH_S) and exits
with status 1, so that a supervisor restarts it.
"""

from __future__ import annotations

import logging
import time
from types import FrameType

import uvicorn

from .state import ServerState

log = logging.getLogger("ninfer.serve")

CANCEL_GRACE_S = 5.0  # after cancelling, how long cancelled responses may take to send their last event
FAILURE_FLUSH_S = 5.0  # after an Engine failure, how long in-flight responses may take to send their error


class Lifecycle:
    """The drain and failure decisions, one `tick(now)` at a time (the server ticks every 0.1 s)."""

    def __init__(self, state: ServerState):
        self.state = state
        self.exit_code = 0
        self.drain_started: float | None = None
        self.failed_at: float | None = None

    def begin_drain(self, now: float) -> None:
        if self.drain_started is None:
            self.drain_started = now
            self.state.draining = True
            log.info("draining: %d request(s) in flight, %g s to finish (--shutdown-timeout)",
                     self.state.requests_in_flight, self.state.limits.shutdown_timeout)

    def tick(self, now: float) -> bool:
        """True when the server should stop now."""
        state, limits = self.state, self.state.limits
        rt = state.runtime
        if limits.exit_on_engine_failure and rt is not None and rt.failure is not None:
            if self.failed_at is None:
                self.failed_at, self.exit_code, state.draining = now, 1, True
                log.error("the engine failed; exiting with status 1 (--exit-on-engine-failure)")
            return state.requests_in_flight == 0 or now - self.failed_at >= FAILURE_FLUSH_S
        if self.drain_started is None:
            return False
        if state.requests_in_flight == 0:
            return True
        overdue = now - self.drain_started - limits.shutdown_timeout
        if overdue >= 0:
            cancelled = state.cancel_all()  # every tick: also what was still being prepared at the last one
            if cancelled:
                log.warning("shutdown timeout: cancelled %d choice(s)", cancelled)
        return overdue >= CANCEL_GRACE_S


class Server(uvicorn.Server):
    """uvicorn's server, with the first exit signal starting a drain and the Lifecycle deciding when to stop."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle):
        super().__init__(config)
        self.lifecycle = lifecycle

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.lifecycle.drain_started is None and not self.should_exit:
            # Not recorded as captured: uvicorn would re-raise it after stopping and skip the Runtime's close.
            self.lifecycle.begin_drain(time.monotonic())
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        return self.lifecycle.tick(time.monotonic())
