"""Bridging Engine handles (blocking queues on the Engine's side) into the server's event loop.

One pump thread per submitted choice forwards its events into one asyncio queue, tagged with the choice index.
Leaving the `choice_events` generator for any reason (done, client gone, task cancelled) closes every handle,
which cancels what still runs and frees its Engine capacity: that is how a disconnect reaches the Engine.
"""

from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator, Awaitable, Callable, Sequence

from ninfer.contracts import GenerationResult, GenerationStart
from ninfer.engine.engine import GenerationHandle

DISCONNECT_POLL_S = 0.25


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


async def choice_events(handles: Sequence[GenerationHandle], metrics=None,
                        disconnected: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[tuple[int, object]]:
    """(choice index, event) in arrival order until every choice has its GenerationResult.

    `disconnected`, when given, is polled while nothing arrives, so a non-streaming request whose client left
    stops too (a streaming response is cancelled by the server instead, which also lands in `finally`).
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    for i, h in enumerate(handles):
        threading.Thread(target=_pump, args=(h, i, loop, queue), name=f"ninfer-pump-{h.request_id}",
                         daemon=True).start()
    remaining = len(handles)
    phase = ["waiting"] * len(handles)  # -> "running" at GenerationStart -> "done" at the result
    if metrics is not None:
        metrics.move(waiting=len(handles))
    try:
        while remaining:
            try:
                index, ev = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S if disconnected else None)
            except asyncio.TimeoutError:
                if disconnected is not None and await disconnected():
                    return
                continue
            if isinstance(ev, BaseException):
                raise ev
            if isinstance(ev, GenerationStart):
                _move(metrics, phase, index, "running")
            elif isinstance(ev, GenerationResult):
                _move(metrics, phase, index, "done")
                remaining -= 1
            yield index, ev
    finally:
        for i, h in enumerate(handles):
            h.close()
            if phase[i] != "done" and metrics is not None:
                metrics.count_finished("cancelled")  # the client left before this choice ended
            _move(metrics, phase, i, "done")


def _move(metrics, phase: list[str], index: int, to: str) -> None:
    """Keep the Gateway's waiting/running gauges in step with one choice's phase."""
    was = phase[index]
    if was == to or was == "done":
        return
    phase[index] = to
    if metrics is not None:
        metrics.move(waiting=-(was == "waiting"), running=(to == "running") - (was == "running"))
