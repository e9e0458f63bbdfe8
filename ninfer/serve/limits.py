"""The Gateway's limits and timeouts, resolved once from `ninfer serve`'s flags (each has its NINFER_* variable).

The Engine's own limits (the waiting-queue bound, the queue timeout) are RuntimeOptions: wiring hands them to the
EngineConfig. Everything here bounds what one connection or one request may cost the server before or around the
Engine: bytes, seconds, connections and schema size. docs/serving.md's runbook lists the defaults.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_BODY_BYTES = 8 << 20  # a request body beyond this is refused (413) before it is parsed
HEADER_READ_TIMEOUT_S = 10.0  # from a request's first byte to its last header line
BODY_READ_TIMEOUT_S = 30.0  # from the headers to the body's last byte
LIMIT_CONCURRENCY = 1024  # open connections; one more is answered 503 and closed
MAX_HEADER_BYTES = 16 << 10  # h11's incomplete-event bound (uvicorn's default): request line plus headers
MAX_SCHEMA_BYTES = 64 << 10  # response_format plus tools, as compact JSON
COMPILE_TIMEOUT_S = 10.0  # one structured-output grammar's compilation (the Frontend's, via RuntimeOptions)
# XGrammar's compile time grows faster than linearly in a string's length bounds and a pattern's repeat counts
# (maxLength 1000: ~1.6 s, 2000: ~8 s, 5000: ~65 s on one core), and a compile cannot be interrupted: counts above
# this are refused before compiling, so that a 40-byte schema cannot hold a core for minutes.
MAX_SCHEMA_REPEAT = 1000
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
SHUTDOWN_TIMEOUT_S = 30.0  # SIGTERM: in-flight requests may finish this long before they are cancelled
PREPARE_WORKERS = 2  # threads that tokenize, hash and compile grammars off the event loop
PREPARE_BACKLOG = 64  # preparations waiting for a worker before new ones are refused (429)


class LimitError(ValueError):
    """A limit flag out of range; the message names the flag."""


@dataclass(frozen=True)
class ServeLimits:
    max_body_bytes: int = MAX_BODY_BYTES
    header_read_timeout: float = HEADER_READ_TIMEOUT_S
    body_read_timeout: float = BODY_READ_TIMEOUT_S
    limit_concurrency: int = LIMIT_CONCURRENCY
    max_header_bytes: int = MAX_HEADER_BYTES
    max_schema_bytes: int = MAX_SCHEMA_BYTES
    request_timeout: float | None = None  # queue plus run, from the body's arrival; None: unbounded
    shutdown_timeout: float = SHUTDOWN_TIMEOUT_S
    exit_on_engine_failure: bool = True
    prepare_workers: int = PREPARE_WORKERS
    prepare_backlog: int = PREPARE_BACKLOG

    def __post_init__(self) -> None:
        positive = {"--max-request-body-bytes": self.max_body_bytes, "--header-read-timeout": self.header_read_timeout,
                    "--body-read-timeout": self.body_read_timeout, "--limit-concurrency": self.limit_concurrency,
                    "--h11-max-incomplete-event-size": self.max_header_bytes,
                    "--max-schema-bytes": self.max_schema_bytes, "prepare_workers": self.prepare_workers,
                    "prepare_backlog": self.prepare_backlog}
        if self.request_timeout is not None:
            positive["--request-timeout"] = self.request_timeout
        for flag, value in positive.items():
            if not value > 0:
                raise LimitError(f"{flag} must be positive, got {value}")
        if self.shutdown_timeout < 0:
            raise LimitError(f"--shutdown-timeout must be >= 0, got {self.shutdown_timeout}")


def schema_bytes(*parts: Any) -> int:
    """The compact-JSON size of what a grammar is compiled from (response_format, tools); nesting too deep to
    serialize counts as unbounded."""
    try:
        return sum(len(json.dumps(p, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
                   for p in parts if p is not None)
    except RecursionError:
        return 1 << 62


def schema_repeat(*parts: Any) -> tuple[str, int] | None:
    """The first `minLength`/`maxLength` or `pattern` repeat count over MAX_SCHEMA_REPEAT, as (keyword, count)."""
    stack = [p for p in parts if p is not None]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            for key, item in v.items():
                if key in ("minLength", "maxLength") and isinstance(item, int) and item > MAX_SCHEMA_REPEAT:
                    return key, item
                if key == "pattern" and isinstance(item, str):
                    counts = [int(n) for m in _REPEAT.finditer(item) for n in m.groups() if n]
                    if counts and max(counts) > MAX_SCHEMA_REPEAT:
                        return "pattern", max(counts)
                stack.append(item)
    return None
