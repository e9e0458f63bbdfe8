"""`ninfer serve`: the HTTP server on uvicorn.

The model loads and warms up first; only a model that loaded gets a port, as `vllm serve` does, so a broken model
is a one-line error and a non-zero exit before anything listens, never a server answering 503. Once the port is
open, /health is 200 and /health/ready 200 until an Engine failure (then 503 with its reason).
"""

from __future__ import annotations

import click

from ninfer.wiring import Runtime

from .app import create_app
from .state import ServerState


def serve(rt: Runtime, *, host: str, port: int, api_key: str | None, log_level: str = "info") -> None:
    """Serve a loaded Runtime until interrupted, then close it."""
    import uvicorn

    try:
        state = ServerState(rt, model_name=rt.name, api_key=api_key)
        app = create_app(state)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        click.echo(f"{rt.summary()} | http://{host}:{port}/v1", err=True)
        server.run()
    finally:
        rt.close()
