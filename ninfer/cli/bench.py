"""`ninfer bench serve` and `ninfer bench agent`: benchmarks against running servers."""

from __future__ import annotations

from pathlib import Path

import click

from .group import main


@main.group()
def bench() -> None:
    """Benchmarks against running servers."""


@bench.command("serve")
@click.option("--base-url", default=None, help="e.g. http://127.0.0.1:8000 (default: http://HOST:PORT).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--endpoint", default="/v1/completions", show_default=True,
              type=click.Choice(["/v1/completions", "/v1/chat/completions"]))
@click.option("--model", default=None, help="Model id (default: the first of GET /v1/models).")
@click.option("--num-prompts", default=20, show_default=True, type=click.IntRange(1))
@click.option("--max-concurrency", default=None, type=click.IntRange(1))
@click.option("--request-rate", default=float("inf"), show_default=True, type=float,
              help="Requests per second, Poisson arrivals (inf: all at once).")
@click.option("--random-input-len", default=32, show_default=True, type=click.IntRange(1))
@click.option("--random-output-len", default=16, show_default=True, type=click.IntRange(1))
@click.option("--metric-percentiles", default="50,90,99", show_default=True)
@click.option("--seed", default=0, show_default=True, type=int, help="Seeds the random prompts.")
@click.option("--temperature", default=0.0, show_default=True, type=float)
@click.option("--api-key", envvar="NINFER_API_KEY", default=None)
@click.option("--save-result", type=click.Path(dir_okay=False), default=None, help="Write the summary as JSON.")
def bench_serve(base_url, host, port, endpoint, model, num_prompts, max_concurrency, request_rate, random_input_len,
                random_output_len, metric_percentiles, seed, temperature, api_key, save_result) -> None:
    """TTFT, TPOT, ITL and end-to-end latency percentiles against any OpenAI-compatible endpoint."""
    import asyncio
    import json

    from ninfer.serve.bench import BenchConfig, format_summary, run_bench, summarize

    try:
        percentiles = tuple(float(p) for p in metric_percentiles.split(","))
    except ValueError:
        raise click.BadParameter("comma-separated numbers, e.g. 50,90,99", param_hint="--metric-percentiles")
    cfg = BenchConfig(base_url or f"http://{host}:{port}", endpoint, model, num_prompts, max_concurrency,
                      request_rate, random_input_len, random_output_len, seed, api_key, temperature)
    records, duration = asyncio.run(run_bench(cfg))
    summary = summarize(records, duration, percentiles)
    click.echo(format_summary(summary))
    if save_result:
        Path(save_result).write_text(json.dumps(summary, indent=2))
    if summary["completed"] == 0:
        raise click.ClickException("no request completed")


@bench.command("agent")
@click.option("--base-url", default=None, help="e.g. http://127.0.0.1:8000 (default: http://HOST:PORT).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--model", default=None, help="Model id (default: the first of GET /v1/models).")
@click.option("--turns", default=10, show_default=True, type=click.IntRange(1))
@click.option("--concurrency", default="1,4", show_default=True,
              help="Comma-separated numbers of conversations run at once; one run each.")
@click.option("--tool-result-len", default=1600, show_default=True, type=click.IntRange(1),
              help="Words per tool result (the context grows by about that many tokens a turn).")
@click.option("--max-tokens", default=16, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--api-key", envvar="NINFER_API_KEY", default=None)
@click.option("--unrelated", default=0, show_default=True, type=click.IntRange(0),
              help="Then run one more conversation, this many unrelated requests, and its next turn: its reuse.")
@click.option("--save-result", type=click.Path(dir_okay=False), default=None, help="Write the per-turn table as JSON.")
def bench_agent(base_url, host, port, model, turns, concurrency, tool_result_len, max_tokens, seed, api_key,
                unrelated, save_result) -> None:
    """Multi-turn tool-calling conversations with thinking: per-turn prompt, new, cached and prefilled tokens and
    TTFT, at each concurrency, and issue 10's targets with pass/fail."""
    import asyncio
    import json

    from ninfer.serve.bench_agent import (AgentConfig, agent_targets, format_targets, format_turns,
                                          reuse_after_unrelated, run_agent_bench, summarize_turns)

    try:
        levels = [int(c) for c in concurrency.split(",")]
    except ValueError:
        raise click.BadParameter("comma-separated integers, e.g. 1,4", param_hint="--concurrency") from None
    results = {}
    for level in levels:
        cfg = AgentConfig(base_url or f"http://{host}:{port}", model, turns, level, tool_result_len, max_tokens, seed,
                          api_key)
        summary = summarize_turns(asyncio.run(run_agent_bench(cfg)))
        click.echo(format_turns(summary, level))
        results[str(level)] = summary
    reuse = asyncio.run(reuse_after_unrelated(cfg, unrelated)) if unrelated else None
    targets = agent_targets({int(k): v for k, v in results.items()}, reuse)
    click.echo(format_targets(targets))
    if save_result:
        Path(save_result).write_text(json.dumps({"runs": results, "reuse": reuse, "targets": targets}, indent=2))
    if any(not s["turns"] for s in results.values()):
        raise click.ClickException("a run completed no turn")
