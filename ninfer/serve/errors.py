"""Every non-2xx answer in OpenAI's error envelope: {"error": {"message", "type", "param", "code"}}.

Validation is 400 (OpenAI's status for input-schema violations; FastAPI's 422 is overridden), a bad key 401, an
unknown model or route 404, a slow body 408, an overloaded Engine 429 (queue full) or 503 (Engine unavailable,
still loading, shutting down; no grammar compiler process or request thread could start). A 5xx never carries
internal exception text: `internal()` logs the detail under an error id and the client gets a generic message with
that id.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ninfer.contracts import RejectReason, RequestRejected
from ninfer.sampling import SamplingParamsError

log = logging.getLogger("ninfer.serve")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error", 429: "rate_limit_error",
          500: "server_error", 503: "service_unavailable_error"}

_REJECT_STATUS = {
    RejectReason.OVERLOADED: 429,
    RejectReason.QUEUE_TIMEOUT: 503,
    RejectReason.ENGINE_UNAVAILABLE: 503,
    RejectReason.GRAMMAR_OVERLOADED: 503,
    RejectReason.GRAMMAR_UNAVAILABLE: 503,
    RejectReason.CONTEXT_TOO_LONG: 400,
    RejectReason.UNREPRESENTABLE: 400,
    RejectReason.INFEASIBLE: 400,
    RejectReason.CANCELLED: 499,
}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @classmethod
    def from_rejection(cls, e: RequestRejected) -> "APIError":
        return cls(_REJECT_STATUS.get(e.reason, 400), e.message, code=e.reason.value)

    @classmethod
    def from_sampling(cls, e: SamplingParamsError) -> "APIError":
        return cls(400, str(e), param=e.field, code="invalid_value")


def internal(status: int, detail: str, *, code: str = "internal_error", what: str | None = None,
             exc: BaseException | None = None) -> APIError:
    """A 5xx whose detail stays in the server log: the client sees `what` happened and the error id to quote."""
    error_id = uuid.uuid4().hex[:16]
    log.error("error %s (%d %s): %s", error_id, status, code, detail, exc_info=exc)
    what = what or ("the engine failed" if code == "engine_error" else "internal server error")
    return APIError(status, f"{what} (error id {error_id})", code=code)


def host_overloaded(what: str, exc: BaseException) -> APIError:
    """A 503 for a request the host could not give a thread (or process) now (`RuntimeError: can't start new
    thread`, an EAGAIN): the server's overload, not the request's fault; the detail goes to the log."""
    log.warning("%s: %s", what, exc)
    return APIError(503, f"the server cannot start {what} right now; retry later", code="server_overloaded")


def envelope(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error" if status >= 500 else
                                                              "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(envelope(status, message, param, code), status_code=status, headers=headers)


def _loc(loc: tuple) -> str | None:
    parts = [p for p in loc if p not in ("body", "query", "path")]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(request: Request, e: APIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if e.status in (429, 503) else None
        return error_response(e.status, e.message, e.param, e.code, headers)

    @app.exception_handler(RequestRejected)
    async def _rejected(request: Request, e: RequestRejected) -> JSONResponse:
        return await _api(request, APIError.from_rejection(e))

    @app.exception_handler(SamplingParamsError)
    async def _sampling(request: Request, e: SamplingParamsError) -> JSONResponse:
        return await _api(request, APIError.from_sampling(e))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
        param = _loc(tuple(first.get("loc", ())))
        message = f"{param}: {first['msg']}" if param else str(first["msg"])
        return error_response(400, message, param, "invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_response(e.status_code, str(e.detail), headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        err = internal(500, f"{request.method} {request.url.path}: {type(e).__name__}", exc=e)
        return error_response(err.status, err.message, code=err.code)
