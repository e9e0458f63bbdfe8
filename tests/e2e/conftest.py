"""Live servers on 127.0.0.1 for the end-to-end tests.

`ninfer serve` runs as a real subprocess (CLI flags, background loading, readiness, uvicorn) with the embedded
random-weight model; the disconnect storm instead runs uvicorn on a thread of the test process, so the test can
read the Engine's and the Program's occupancy after the storm.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

READY_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, args: list[str], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "ninfer.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--no-progress", "--uvicorn-log-level", "warning", *args]
        self.proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/health/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server not ready in {READY_TIMEOUT_S} s:\n{self.log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture(scope="session")
def _default_model_built():
    """Build the embedded model once in this session's cache before servers race to build it."""
    from ninfer.convert.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def live_server(_default_model_built, tmp_path_factory):
    server = LiveServer(["--max-model-len", "512", "--max-num-seqs", "4", "--served-model-name", "ninfer-test"],
                        tmp_path_factory.mktemp("serve") / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def scoring_server(_default_model_built, tmp_path_factory):
    server = LiveServer(["--purpose", "scoring", "--max-model-len", "512", "--score-window", "128",
                         "--score-stride", "64"], tmp_path_factory.mktemp("score") / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


class ThreadServer:
    """uvicorn serving an app on a thread of this process (a real socket on 127.0.0.1)."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "ThreadServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)


@pytest.fixture
def thread_server():
    return ThreadServer


def pytest_collection_modifyitems(config, items):
    """Heavier variants (marked slow) run only when asked for with `-m slow`, as pyproject's marker says."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow variant: opt in with -m slow")
    here = Path(__file__).parent
    for item in items:
        if "slow" in item.keywords and here in Path(str(item.fspath)).parents:
            item.add_marker(skip)
