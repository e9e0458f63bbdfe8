"""Request bodies parsed off the event loop: FastAPI's routes get a Request whose `json()` runs on a parser thread.

FastAPI parses a JSON body with `await request.json()` on the event loop, and validates it there; a multi-megabyte
body (210k tiny messages: ~60 ms of json.loads, ~50 ms of validation on an idle core) stalled every other
connection, /health included. Here the parse, body_checks.check_json and the validation against the route's body
model run together on one parser thread, bodies in arrival order. The GIL still serializes the parse with the loop,
but the loop gets it back between bodies and every switch interval of the checks' Python code, instead of waiting
for every body in a burst. The body size was bounded before (guard.py: 413 before a byte is parsed). A check's
refusal is kept with the parsed body and raised by `checked_body`, the app-wide dependency that runs before
FastAPI validates the body; a parse error is raised from `json()` itself, where FastAPI turns it into its own 400.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from fastapi import Request, Response
from fastapi.routing import APIRoute

from .body_checks import check_json
from .errors import APIError

if TYPE_CHECKING:
    from fastapi._compat import ModelField

JSON_METHODS = ("POST", "PUT", "PATCH")
# One thread: parses hold the GIL (json.loads is one C call), so more threads would not parse faster, only make the
# event loop wait behind more of them each time it needs the GIL back.
_PARSER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ninfer-body")


def parse_body(body: bytes, field: "ModelField | None" = None) -> tuple[Any, APIError | None]:
    """The body, and the body check's refusal (None when it passes); json.loads' own errors propagate.

    With the route's body `field`, a body that passes the checks and validates comes back as the validated model:
    FastAPI validates what `json()` returned again, and a model instance passes that on the loop at once. One that
    does not validate comes back as parsed, and FastAPI's validation on the loop reports its errors as before.
    """
    value = json.loads(body)
    try:
        check_json(value, raw=body)
    except APIError as e:
        return value, e
    if field is not None:
        validated, errors = field.validate(value, {}, loc=("body",))
        if not errors:
            return validated, None
    return value, None


class OffLoopRequest(Request):
    body_error: APIError | None = None
    body_field: "ModelField | None" = None  # the route's single body parameter

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            loop = asyncio.get_running_loop()
            self._json, self.body_error = await loop.run_in_executor(_PARSER, parse_body, body, self.body_field)
        return self._json


class OffLoopRoute(APIRoute):
    """The app's route class: every handler (and its dependencies) sees an OffLoopRequest."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()
        # one body model taken whole (every route here): the thread validates exactly what FastAPI would (embedded
        # fields are validated one by one under their own names; those stay with FastAPI)
        field = None if getattr(self, "_embed_body_fields", True) else self.body_field

        async def route(request: Request) -> Response:
            off_loop = OffLoopRequest(request.scope, request.receive)
            off_loop.body_field = field
            return await handler(off_loop)

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
