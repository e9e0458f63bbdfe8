"""Bridging Engine handles (blocking queues on the Engine's side) into the server's event loop.

One pump thread per submitted choice forwards its events into one asyncio queue, tagged with the choice index; the
pumps start before the response does (a host out of threads is a 503, `Choices.pump`).
`Choices.close()` runs however a response ends (done, client gone, task cancelled, or a stream closed before its
body ever ran): it closes every handle, which cancels what still runs and frees its Engine capacity. That is how
a disconnect reaches the Engine.

The client's disconnect is polled on a clock, not only when nothing arrives: a streaming choice may produce many
tokens whose text is still held back (an incomplete UTF-8 character, a possible stop string), so nothing is sent
and the transport alone would notice the departure only at the end of the generation.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import AsyncIterator, Awaitable, Callable, Sequence

from ninfer.contracts import GenerationResult, GenerationStart
from ninfer.engine.engine import GenerationHandle

from .errors import host_overloaded

DISCONNECT_POLL_S = 0.25


class Choices:
    """The handles of one API request with each choice's phase (waiting -> running -> done) kept in the
    Gateway's gauges; a choice closed before its result counts as cancelled."""

    def __init__(self, handles: Sequence[GenerationHandle], metrics=None, registry: set | None = None):
        self.handles, self.metrics, self.registry = list(handles), metrics, registry
        self.phase = ["waiting"] * len(self.handles)
        self.queue: asyncio.Queue | None = None  # (choice index, event), filled by the pumps (`pump`)
        if metrics is not None:
            metrics.move(waiting=len(self.handles))
        if registry is not None:
            registry.add(self)

    def __len__(self) -> int:
        return len(self.handles)

    def seen(self, index: int, ev: object) -> None:
        if isinstance(ev, GenerationStart):
            self._move(index, "running")
        elif isinstance(ev, GenerationResult):
            self._move(index, "done")

    def pump(self) -> None:
        """Start one pump thread per choice into `queue`, on the running loop: before a response starts, so that a
        host out of threads answers 503 in the envelope (`host_overloaded`), every handle closed (its Engine
        capacity freed), and the server goes on serving."""
        loop, self.queue = asyncio.get_running_loop(), asyncio.Queue()
        try:
            for i, h in enumerate(self.handles):
                threading.Thread(target=_pump, args=(h, i, loop, self.queue), name=f"ninfer-pump-{h.request_id}",
                                 daemon=True).start()
        except RuntimeError as e:  # can't start new thread: a pump already started ends with its closed handle
            self.close()
            raise host_overloaded("a thread for this request's output", e) from None

    def cancel(self) -> int:
        """Ask the Engine to end every unfinished choice; their events keep flowing to the response. Returns
        how many were still unfinished."""
        open_ = [h for h, phase in zip(self.handles, self.phase) if phase != "done"]
        for h in open_:
            h.cancel()
        return len(open_)

    def close(self) -> None:
        if self.registry is not None:
            self.registry.discard(self)
        for i, h in enumerate(self.handles):
            h.close()
            if self.phase[i] != "done" and self.metrics is not None:
                self.metrics.count_finished("cancelled")  # the client left before this choice ended
            self._move(i, "done")

    def _move(self, index: int, to: str) -> None:
        was = self.phase[index]
        if was == to or was == "done":
            return
        self.phase[index] = to
        if self.metrics is not None:
            self.metrics.move(waiting=-(was == "waiting"), running=(to == "running") - (was == "running"))


def _pump(handle: GenerationHandle, index: int, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
    try:
        for ev in handle.events():
            loop.call_soon_threadsafe(queue.put_nowait, (index, ev))
    except RuntimeError:
        pass  # the event loop closed under us (server shutdown): nobody is left to tell
    except BaseException as e:  # noqa: BLE001 - forwarded to the request's task, which answers with an error
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (index, e))
        except RuntimeError:
            pass


async def choice_events(choices: Choices, disconnected: Callable[[], Awaitable[bool]] | None = None) \
        -> AsyncIterator[tuple[int, object]]:
    """(choice index, event) in arrival order until every choice has its GenerationResult, or the client left; the
    choices' pumps are started (`Choices.pump`)."""
    queue = choices.queue
    assert queue is not None, "choice_events before Choices.pump"
    remaining, checked = len(choices), time.monotonic()
    try:
        while remaining:
            try:
                item = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S if disconnected else None)
            except asyncio.TimeoutError:
                item = None
            if disconnected is not None and time.monotonic() - checked >= DISCONNECT_POLL_S:
                checked = time.monotonic()
                if await disconnected():
                    return
            if item is None:
                continue
            index, ev = item
            if isinstance(ev, BaseException):
                raise ev
            choices.seen(index, ev)
            remaining -= isinstance(ev, GenerationResult)
            yield index, ev
    finally:
        choices.close()
