"""A server process started by a test or a benchmark: a free local port, and the wait until its /health/ready
answers 200 (or the process exits first)."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float, log: Path | None = None) -> float:
    """Seconds until `url`/health/ready answered 200; RuntimeError (with `log`'s text) when `proc` exits first or
    the timeout passes."""
    import httpx

    def failed(what: str) -> RuntimeError:
        return RuntimeError(what if log is None else f"{what}:\n{log.read_text()}")
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise failed(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health/ready", timeout=2.0).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:  # not listening yet
            pass
        time.sleep(0.5)
    raise failed(f"server not ready in {timeout_s:.0f} s")
