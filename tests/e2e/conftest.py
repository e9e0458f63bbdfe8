"""Live servers on 127.0.0.1 for the end-to-end tests.

`ninfer serve` runs as a real subprocess (CLI flags, background loading, readiness, uvicorn) with the embedded
random-weight model; the disconnect storm instead runs uvicorn on a thread of the test process, so the test can
read the Engine's and the Program's occupancy after the storm.

The Program is the reference one, or with NINFER_TEST_DEVICE=cuda (and a GPU) the fast one (`--program fast`); the
live server's tests carry it in their ids (`test_models_and_chat[fast]`) and its log must say it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from ninfer.serve.lifecycle import Lifecycle, Server
from ninfer.testing.live_server import free_port, wait_ready
from ninfer.serve.protocol import bounded_protocol

READY_TIMEOUT_S = 240
ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda"
PROGRAM = "fast" if ON_GPU else "reference"
# What the fast Program may plan with beyond the memory in use when it starts (weights, pools, graphs): the embedded
# model needs a few MiB; more only makes the KV page list longer.
GPU_HEADROOM_BYTES = 4 << 30


SERVER_LINES: list[str] = []  # the live servers' readiness lines, shown in the terminal summary


def pytest_terminal_summary(terminalreporter):
    for line in SERVER_LINES:
        terminalreporter.write_line(f"e2e live server: {line}")


def gpu_memory_utilization() -> float:
    """A --gpu-memory-utilization that leaves GPU_HEADROOM_BYTES beyond what is in use now. vLLM's meaning (a share
    of the whole device, less what every process holds) makes any fixed share collide with another server or with
    this process's cached blocks."""
    import torch

    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return min(0.95, (total - free + GPU_HEADROOM_BYTES) / total)


def program_args() -> list[str]:
    if PROGRAM == "fast":
        return ["--program", "fast", "--gpu-memory-utilization", f"{gpu_memory_utilization():.4f}"]
    return ["--program", "reference"]


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
        wait_ready(self.url, self.proc, READY_TIMEOUT_S, self.log)

    def wait_log(self, text: str, timeout_s: float = 10) -> str:
        """The log line holding ``text`` (the readiness summary is printed just after /health/ready turns 200)."""
        deadline = time.monotonic() + timeout_s
        while True:
            lines = [line for line in self.log.read_text().splitlines() if text in line]
            if lines:
                return lines[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"server log lacks {text!r}:\n{self.log.read_text()}")
            time.sleep(0.1)

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


@pytest.fixture(scope="session", params=[PROGRAM])
def live_server(request, _default_model_built, tmp_path_factory):
    server = LiveServer(["--max-model-len", "512", "--max-num-seqs", "4", "--served-model-name", "ninfer-test",
                         *program_args()], tmp_path_factory.mktemp("serve") / "server.log")
    try:
        server.wait_ready()
        SERVER_LINES.append(server.wait_log(f"on the {request.param} Program"))
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
    """uvicorn serving an app on a thread of this process (a real socket on 127.0.0.1), configured as `ninfer serve`
    configures it: the bounded h11 protocol and the drain Lifecycle (`lifecycle.begin_drain` stands in for SIGTERM,
    which only the main thread can receive)."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        state = app.state.ninfer
        self.lifecycle = Lifecycle(state)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                http=bounded_protocol(state.limits),
                                h11_max_incomplete_event_size=state.limits.max_header_bytes)
        self.server = Server(config, self.lifecycle)
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


@pytest.fixture(scope="session")
def small_runtime(_default_model_built):
    """The reference Program at a small size (context 256, 2 lanes, a queue of 4 so that a burst overflows it) and
    no prefix caching (a finished request leaves nothing behind, so the Program's baseline is exact); shared by the
    hostile-input and lifecycle tests, each over its own ServerState."""
    from ninfer.runtime_options import RuntimeOptions
    from ninfer.wiring import build_runtime

    rt = build_runtime(RuntimeOptions(max_model_len=256, max_num_seqs=2, max_queued_requests=4,
                                      enable_prefix_caching=False, program="reference"), progress=False)
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def program_options():
    """RuntimeOptions fields that pick this run's Program (see the module doc) for in-process runtimes; the GPU
    memory share is measured when the module's runtime starts (after any live server)."""
    if PROGRAM == "fast":
        return {"program": "fast", "gpu_memory_utilization": gpu_memory_utilization()}
    return {"program": "reference"}
