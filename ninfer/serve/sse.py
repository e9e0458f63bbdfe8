"""Server-sent events exactly as OpenAI clients parse them: `data: {json}\\n\\n` per chunk, `data: [DONE]` last.

The response closes its request's handles however the transfer ends (finished, client gone, server cancelled),
so a disconnected client always frees its Engine capacity, even when the cancellation lands outside the body
iterator.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .errors import envelope

DONE = b"data: [DONE]\n\n"


def event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def error_event(status: int, message: str, code: str | None = None) -> bytes:
    return event(envelope(status, message, None, code))


class EventStream(StreamingResponse):
    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[], None]):
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
