"""The ASGI guard in front of every route: API key, admission while draining, and the request body's size and time
bounds, all before FastAPI parses anything.

The body is read here whole (up to `--max-request-body-bytes`, within `--body-read-timeout`) and replayed to the
app; what the app receives afterwards is the client's own stream, so a later disconnect still reaches it. Requests
in flight are counted here, so the graceful shutdown knows when the last one has answered.
"""

from __future__ import annotations

import asyncio
import hmac
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_response
from .state import ServerState

# Open without the API key: probes and scrapers. /docs and /openapi.json describe the API and need the key.
OPEN_PATHS = ("/health", "/health/ready", "/metrics", "/ping", "/version")


class _BodyRefused(Exception):
    def __init__(self, status: int, message: str, code: str):
        self.status, self.message, self.code = status, message, code


class Guard:
    def __init__(self, app: ASGIApp, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        open_path = scope["path"] in OPEN_PATHS
        refusal = None if open_path else self._refusal(headers)
        if refusal is not None:
            return await refusal(scope, receive, send)
        try:
            body = await self._read_body(receive, headers.get("content-length"))
        except _BodyRefused as e:
            return await error_response(e.status, e.message, code=e.code)(scope, receive, send)
        if body is None:
            return  # the client left before its body arrived
        with self.state.in_flight():
            await self.app(scope, _replay(body, receive), send)

    def _refusal(self, headers: dict[str, str]):
        key = self.state.api_key
        if key:
            auth = headers.get("authorization", "")
            given = auth[7:] if auth.lower().startswith("bearer ") else headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), key.encode()):
                return error_response(401, "invalid or missing API key", code="invalid_api_key")
        if self.state.draining:
            return error_response(503, "the server is shutting down", code="shutting_down",
                                  headers={"Retry-After": "1", "Connection": "close"})
        return None

    async def _read_body(self, receive: Receive, length: str | None) -> bytes | None:
        limit = self.state.limits.max_body_bytes
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise _BodyRefused(413, f"request body over {limit} bytes", "body_too_large")
        timeout = self.state.limits.body_read_timeout
        deadline = time.monotonic() + timeout
        chunks, seen = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except asyncio.TimeoutError:
                raise _BodyRefused(408, f"the request body did not arrive within {timeout:g} s "
                                   "(--body-read-timeout)", "body_read_timeout") from None
            if message["type"] != "http.request":
                return None
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > limit:
                raise _BodyRefused(413, f"request body over {limit} bytes", "body_too_large")
            if not message.get("more_body"):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
