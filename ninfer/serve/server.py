"""`ninfer serve`: the HTTP server on uvicorn.

The port opens at once and the model loads (and warms up) on a background thread, so /health answers 200 and
/health/ready 503 until the Engine is available, as llama-server does; a failed load keeps 503 with the reason.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import click

from ninfer.wiring import Runtime

from .app import create_app
from .state import ServerState

log = logging.getLogger("ninfer.serve")


def load_in_background(state: ServerState, load: Callable[[], Runtime], on_ready: Callable[[Runtime], None]) -> \
        threading.Thread:
    def run() -> None:
        try:
            rt = load()
        except click.ClickException as e:
            state.load_error = f"model failed to load: {e.message}"
            log.error(state.load_error)
            return
        except Exception as e:  # noqa: BLE001 - reported through /health/ready; the process stays up to say why
            state.load_error = f"model failed to load: {type(e).__name__}: {e}"
            log.exception("model failed to load")
            return
        state.runtime = rt
        on_ready(rt)

    thread = threading.Thread(target=run, name="ninfer-load", daemon=True)
    thread.start()
    return thread


def serve(load: Callable[[], Runtime], *, model_name: str, host: str, port: int, api_key: str | None,
          log_level: str = "info") -> None:
    import uvicorn

    state = ServerState(None, model_name, api_key=api_key)
    app = create_app(state)

    def ready(rt: Runtime) -> None:
        state.model_name = rt.name
        state.metrics.model = rt.name
        click.echo(f"{rt.summary()} | http://{host}:{port}/v1", err=True)

    load_in_background(state, load, ready)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    try:
        uvicorn.Server(config).run()
    finally:
        if state.runtime is not None:
            state.runtime.close()
