"""The server's lifecycle on a real socket: header read timeout and connection limit (raw sockets), the drain
that SIGTERM starts (in-flight requests finish or end with their terminal event, new ones get 503), the exit on
an Engine failure, and `ninfer serve` itself answering SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from ninfer.serve.app import create_app
from ninfer.serve.lifecycle import Lifecycle
from ninfer.serve.limits import ServeLimits
from ninfer.serve.state import ServerState

from .conftest import LiveServer, free_port

CHAT = "/v1/chat/completions"
LONG = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 200, "stream": True}


@pytest.fixture
def runtime(small_runtime):
    return small_runtime


def _raw(sock: socket.socket) -> tuple[int, dict]:
    sock.settimeout(30)  # a missing bound fails the test instead of hanging it
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_slow_headers_get_408_and_extra_connections_503(runtime, thread_server):
    state = ServerState(runtime, runtime.name, limits=ServeLimits(header_read_timeout=0.3, limit_concurrency=2))
    with thread_server(create_app(state)) as server:
        slow = socket.create_connection(("127.0.0.1", server.port))
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        idle = socket.create_connection(("127.0.0.1", server.port))
        time.sleep(0.05)
        extra = socket.create_connection(("127.0.0.1", server.port))
        status, body = _raw(extra)
        assert status == 503 and body["error"]["code"] == "too_many_connections"
        status, body = _raw(slow)
        assert status == 408 and body["error"]["code"] == "header_read_timeout"
        status, _ = _raw(idle)  # a connection that never sends a byte is timed out the same way
        assert status == 408
        assert httpx.get(f"{server.url}/health").status_code == 200  # room again once they closed


def _events(resp) -> list[dict | str]:
    out = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            out.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
    return out


def test_drain_refuses_new_work_and_ends_every_stream(runtime, thread_server):
    state = ServerState(runtime, runtime.name, limits=ServeLimits(shutdown_timeout=3.0))
    with thread_server(create_app(state)) as server:
        got: dict = {}

        def stream() -> None:
            with httpx.stream("POST", f"{server.url}{CHAT}", json=LONG, timeout=60) as resp:
                got["events"] = _events(resp)

        client = threading.Thread(target=stream)
        client.start()
        deadline = time.monotonic() + 30
        while not state.metrics.running and time.monotonic() < deadline:
            time.sleep(0.05)
        server.lifecycle.begin_drain(time.monotonic())
        refused = httpx.post(f"{server.url}{CHAT}", json={**LONG, "stream": False}, timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert httpx.get(f"{server.url}/health/ready").status_code == 503
        client.join(30)
        server.thread.join(30)
        assert not server.thread.is_alive(), "the drained server did not stop"
    events = got["events"]
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "shutting_down", events[-3:]
    assert runtime.engine.outstanding == 0


def test_engine_failure_stops_the_server_with_status_1():
    from ninfer.serve.server import serve

    fake = SimpleNamespace(name="m", summary=lambda: "fake", failure=None, available=True, purpose="generation",
                           engine=None, scorer=None, close=lambda: None)
    port, outcome = free_port(), {}

    def run() -> None:
        try:
            serve(fake, host="127.0.0.1", port=port, api_key=None, log_level="warning")
        except SystemExit as e:
            outcome["code"] = e.code

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    fake.failure, fake.available = "EngineFailure: planted", False
    thread.join(30)
    assert outcome == {"code": 1}


def test_without_exit_on_failure_the_server_stays_up_and_says_so():
    fake = SimpleNamespace(failure="EngineFailure: planted", available=False)
    lifecycle = Lifecycle(ServerState(fake, "m", limits=ServeLimits(exit_on_engine_failure=False)))
    assert lifecycle.tick(time.monotonic()) is False and lifecycle.exit_code == 0


def test_sigterm_drains_and_exits_0(_default_model_built, tmp_path):
    server = LiveServer(["--max-model-len", "256", "--max-num-seqs", "1", "--program", "reference",
                         "--shutdown-timeout", "1"], tmp_path / "server.log")
    try:
        server.wait_ready()
        with httpx.stream("POST", f"{server.url}{CHAT}", json=LONG, timeout=60) as resp:
            lines = resp.iter_lines()
            next(line for line in lines if '"content":""' not in line and line.startswith("data: "))
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            refused = httpx.get(f"{server.url}/health/ready", timeout=5)
            rest = [line for line in lines if line.startswith("data: ")]
        assert refused.status_code == 503
        assert rest[-1] == "data: [DONE]" and "shutting_down" in rest[-2], rest[-3:]
        assert server.proc.wait(30) == 0
    finally:
        server.stop()
