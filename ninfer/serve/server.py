"""`ninfer serve`: the HTTP server on uvicorn.

The model loads and warms up first; only a model that loaded gets a port, as `vllm serve` does, so a broken model
is a one-line error and a non-zero exit before anything listens, never a server answering 503. Once the port is
open, /health and /health/ready are 200 until a drain (ready 503) or an Engine failure (both 503). uvicorn runs
with the bounded h11 protocol (header read timeout, connection limit) and the Lifecycle (SIGTERM drains; an Engine
failure exits with status 1 under --exit-on-engine-failure).
"""

from __future__ import annotations

import socket

import click

from ninfer.errors import UnavailableError
from ninfer.runtime import Runtime

from .app import create_app
from .lifecycle import CANCEL_GRACE_S, Lifecycle, Server
from .limits import ServeLimits
from .protocol import bounded_protocol
from .state import ServerState


def check_port(host: str, port: int) -> None:
    """Fail before loading when ``host:port`` cannot be bound (another server holds it, or no such address)."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise UnavailableError(f"cannot listen on {host}:{port}: {e.strerror or e}").locate(
            "--host, --port", hint="stop the other server or pick another --port") from None


def serve(rt: Runtime, *, host: str, port: int, api_key: str | None, limits: ServeLimits = ServeLimits(),
          log_level: str = "info") -> None:
    """Serve a loaded Runtime until drained or interrupted, then close it; SystemExit(1) after an Engine failure."""
    import uvicorn

    try:
        state = ServerState(rt, model_name=rt.name, api_key=api_key, limits=limits)
        config = uvicorn.Config(create_app(state), host=host, port=port, log_level=log_level,
                                http=bounded_protocol(limits), h11_max_incomplete_event_size=limits.max_header_bytes,
                                timeout_graceful_shutdown=int(CANCEL_GRACE_S))
        lifecycle = Lifecycle(state)
        click.echo(f"{rt.summary()} | http://{host}:{port}/v1", err=True)
        try:
            Server(config, lifecycle).run()
        finally:
            state.preparer.close()
    finally:
        rt.close()
    if lifecycle.exit_code:
        raise SystemExit(lifecycle.exit_code)
