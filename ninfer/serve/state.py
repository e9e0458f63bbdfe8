"""What every route shares: the Runtime (Frontend + Engine or scoring core), names, limits, metrics, the
preparation pool and the server's lifecycle flags (draining, requests in flight)."""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from ninfer.contracts import RequestRejected
from ninfer.runtime import Runtime

from .errors import APIError
from .events import Choices
from .limits import MAX_SCHEMA_REPEAT, ServeLimits, schema_bytes, schema_repeat
from .metrics import Metrics
from .prepare import Preparer


@dataclass
class ServerState:
    runtime: Runtime  # loaded before the port opens (ninfer.serve.server)
    model_name: str
    api_key: str | None = None
    limits: ServeLimits = field(default_factory=ServeLimits)
    metrics: Metrics = field(init=False)
    preparer: Preparer = field(init=False)
    draining: bool = False  # SIGTERM seen: new requests get 503, in-flight ones finish or are cancelled
    active: set = field(default_factory=set)  # the events.Choices of every response still streaming or waiting
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.model_name)
        self.preparer = Preparer(self.limits.prepare_workers, self.limits.prepare_backlog)

    @property
    def requests_in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        with self._lock:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1

    def abandon(self, handles: Sequence) -> None:
        """Close handles nobody will read (their client left while they were being submitted), counted as
        cancelled like any other dropped choice."""
        Choices(handles, self.metrics).close()

    def cancel_all(self) -> int:
        """Cancel every choice in flight (the shutdown timeout passed); each still ends with its terminal event."""
        return sum(choices.cancel() for choices in list(self.active))  # the event loop's thread only

    def deadline(self) -> float | None:
        """The absolute time.monotonic() by which a request arriving now must end (--request-timeout)."""
        timeout = self.limits.request_timeout
        return None if timeout is None else time.monotonic() + timeout

    @property
    def fingerprint(self) -> str:
        rt = self.runtime
        key = f"{self.model_name}|{rt.model_path.name}|{rt.program_kind}"
        return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:12]

    def ready(self) -> Runtime:
        if self.draining:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        if not self.runtime.available:
            # The Engine's reason is in the server log (logged once when it failed), never in a response.
            why = "failed; the server log has the reason" if self.runtime.failure else "is shut down"
            raise APIError(503, f"the engine {why}", code="engine_unavailable")
        return self.runtime

    def check_model(self, model: str | None) -> None:
        """An absent model means the served one (vLLM's behaviour); another name is 404."""
        self.ready()
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist (this server serves `{self.model_name}`).",
                           param="model", code="model_not_found")

    def check_schema(self, response_format: object, tools: object) -> None:
        """Refuse a grammar source over --max-schema-bytes before anything compiles it."""
        size, limit = schema_bytes(response_format, tools), self.limits.max_schema_bytes
        if size > limit:
            param = "response_format" if schema_bytes(response_format) > limit or not tools else "tools"
            raise APIError(400, f"{param}: the schema is over {limit} bytes as JSON (--max-schema-bytes)",
                           param=param, code="schema_too_large")
        repeat = schema_repeat(response_format, tools)
        if repeat is not None:
            param = "response_format" if schema_repeat(response_format) else "tools"
            raise APIError(400, f"{param}: {repeat[0]} {repeat[1]} is over {MAX_SCHEMA_REPEAT}, the most a grammar "
                           "is compiled for here", param=param, code="schema_too_complex")

    def require_generation(self) -> None:
        if self.ready().engine is None:
            raise APIError(400, "this server runs the scoring purpose: only /v1/completions with echo and "
                           "max_tokens 0 or 1 is served (start it with --purpose generation to generate)",
                           code="wrong_purpose")

    def submit_choices(self, build: Callable[[object], object], params: Sequence) -> list:
        """Build every choice's Engine request, then submit them all or none (Engine.submit_all): a refusal
        takes no Engine capacity, so a rejected batch never crowds out other clients."""
        try:
            requests = [build(p) for p in params]
            return self.runtime.engine.submit_all(requests)
        except RequestRejected as e:
            self.metrics.reject(e.reason.value)
            raise APIError.from_rejection(e) from None
