"""What every HTTP robustness test asserts: no 5xx, OpenAI's error envelope on every refusal, and afterwards a
ready server whose capacity is back at its baseline (nothing outstanding, waiting, running or being prepared)."""

from __future__ import annotations

import time

import httpx

SETTLE_S = 20  # cancelled or finished work settles in well under this


def check_answer(status: int, body: bytes, what: str) -> None:
    import json

    assert status < 500, f"{what} -> {status}: {body[:300]!r}"
    if status >= 400:
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}, f"{what} -> {status}: {body[:300]!r}"
        assert isinstance(error["message"], str) and error["message"], what


def assert_baseline(url: str, state) -> None:
    """The server is ready and holds nothing: Engine outstanding 0, no choice waiting or running, no preparation
    pending, no request in flight (the check's own /metrics read aside)."""
    engine = state.runtime.engine
    deadline = time.monotonic() + SETTLE_S

    def busy() -> bool:
        return bool(engine.outstanding or state.metrics.waiting or state.metrics.running or state.preparer.pending
                    or state.requests_in_flight)

    while busy() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not busy(), (engine.outstanding, state.metrics.waiting, state.metrics.running, state.preparer.pending,
                        state.requests_in_flight)
    assert httpx.get(f"{url}/health/ready", timeout=10).status_code == 200
    gauges = {line.split()[0]: float(line.split()[1]) for line in httpx.get(f"{url}/metrics", timeout=10).text
              .splitlines() if line.startswith(("ninfer:num_requests", "ninfer:engine_"))}
    assert gauges == {"ninfer:num_requests_waiting": 0, "ninfer:num_requests_running": 0,
                      "ninfer:engine_outstanding": 0, "ninfer:engine_available": 1}, gauges
