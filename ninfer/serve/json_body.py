"""Request bodies parsed off the event loop: FastAPI's routes get a Request whose `json()` runs on a worker thread.

FastAPI parses a JSON body with `await request.json()` on the event loop; a multi-megabyte body (210k tiny
messages: ~60 ms of json.loads, ~150 ms of body checks) stalled every other connection, /health included, while
it parsed. Here the parse and body_checks.check_json run together on one parser thread, bodies in arrival order. The
GIL still serializes the parse with the loop, but the loop gets it back between bodies and every switch interval
of the checks' Python code, instead of waiting for every body in a burst. The body size was bounded before (guard.py: 413 before a byte is parsed). A check's refusal is kept with
the parsed body and raised by `checked_body`, the app-wide dependency that runs before the body is validated; a
parse error is raised from `json()` itself, where FastAPI turns it into its own 400.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from fastapi import Request, Response
from fastapi.routing import APIRoute

from .body_checks import check_json
from .errors import APIError

JSON_METHODS = ("POST", "PUT", "PATCH")
# One thread: parses hold the GIL (json.loads is one C call), so more threads would not parse faster, only make the
# event loop wait behind more of them each time it needs the GIL back.
_PARSER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ninfer-body")


def parse_body(body: bytes) -> tuple[Any, APIError | None]:
    """The parsed body and the body check's refusal (None when it passes); json.loads' own errors propagate."""
    value = json.loads(body)
    try:
        check_json(value, raw=body)
    except APIError as e:
        return value, e
    return value, None


class OffLoopRequest(Request):
    body_error: APIError | None = None

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json, self.body_error = await asyncio.get_running_loop().run_in_executor(_PARSER, parse_body, body)
        return self._json


class OffLoopRoute(APIRoute):
    """The app's route class: every handler (and its dependencies) sees an OffLoopRequest."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(OffLoopRequest(request.scope, request.receive))

        return route


def takes_json(request: Request) -> bool:
    """Whether a body would be read as JSON: a JSON content type, or none at all."""
    kind = request.headers.get("content-type", "")
    return request.method in JSON_METHODS and (not kind or "json" in kind)


async def checked_body(request: OffLoopRequest) -> None:
    """App-wide dependency: the body check's refusal, before validation (the parse and check ran on a thread)."""
    if not takes_json(request):
        return
    try:
        await request.json()
    except Exception:  # noqa: BLE001 - an unparsable body is FastAPI's own 400, raised by the route
        return
    if request.body_error is not None:
        raise request.body_error
