"""`ninfer serve` and `ninfer score`: the OpenAI-compatible server, and scoring texts from JSONL."""

from __future__ import annotations

import functools

import click

from ninfer.serve.cli_command import grouped_option, needs_extra
from ninfer.serve.cli_options import (model_argument, pick_model, runtime_options, serve_limits, serve_options,
                                      start_runtime)

from .group import main, ninfer_option


_frontend_option = functools.partial(grouped_option, group="Frontend")


def _score_options(fn):
    for option in reversed([
        ninfer_option("--score-window", env="SCORE_WINDOW", type=click.IntRange(2), default=None,
                      help="Scoring purpose: tokens per window (default 512)."),
        ninfer_option("--score-stride", env="SCORE_STRIDE", type=click.IntRange(1), default=None,
                      help="Scoring purpose: tokens between window starts (default: half a window)."),
    ]):
        fn = option(fn)
    return fn


@main.command()
@model_argument
@runtime_options
@_frontend_option("--host", env="HOST", default="127.0.0.1", show_default=True)
@_frontend_option("--port", env="PORT", default=8000, show_default=True, type=click.IntRange(0, 65535))
@_frontend_option("--api-key", env="API_KEY", default=None,
                  help="Require `Authorization: Bearer KEY` on the API routes.")
@_frontend_option("--uvicorn-log-level", env="UVICORN_LOG_LEVEL", default="info", show_default=True,
                  type=click.Choice(["critical", "error", "warning", "info", "debug", "trace"]))
@_score_options
@serve_options
def serve(runtime: dict, limits: dict, host: str, port: int, api_key: str | None, uvicorn_log_level: str,
          score_window: int | None, score_stride: int | None) -> None:
    """Serve the OpenAI-compatible API (chat, completions, models, health, metrics, tokenize).

    The model loads first: one that does not load ends the command with one line and a non-zero exit before the
    port is bound."""
    with needs_extra("serve"):
        import uvicorn  # noqa: F401 - checked before the model loads

        from ninfer.serve.server import check_port, serve as run
    gateway = serve_limits(limits)  # a bad limit is a usage error before the model loads
    check_port(host, port)  # a taken port fails now, not after minutes of loading
    rt = start_runtime(runtime, score_window=score_window, score_stride=score_stride,
                       max_queued_requests=limits["max_queued_requests"], queue_timeout=limits["queue_timeout"],
                       grammar_compile_timeout=limits["grammar_compile_timeout"], announce=False)
    run(rt, host=host, port=port, api_key=api_key, limits=gateway, log_level=uvicorn_log_level)


@main.command()
@click.argument("words", metavar="[MODEL] [INPUT]", nargs=-1)
@ninfer_option("--output", "-o", env="SCORE_OUTPUT", type=click.File("w"), default="-",
               help="JSONL out (default stdout).")
@runtime_options
@_score_options
def score(words: tuple[str, ...], output, runtime: dict, score_window: int | None, score_stride: int | None) -> None:
    """Score texts: JSONL in ({"text": ...} or {"tokens": [...]}), per-token logprobs and totals out.

    MODEL (a .ninfer file or a checkpoint directory) and INPUT (a JSONL file, default stdin) are both optional:
    one word is the model when it names a directory or a .ninfer file, else the input."""
    from ninfer.serve.scoring_cli import report_failures, score_lines, split_score_words

    model, source = split_score_words(words)
    pick_model(runtime, model)
    with click.open_file(source, "r") as input_file:
        rt = start_runtime(runtime, purpose="scoring", score_window=score_window, score_stride=score_stride)
        try:
            failures = score_lines(rt, input_file, output)
        finally:
            rt.close()
    report_failures(failures, lambda line: click.echo(line, err=True))
