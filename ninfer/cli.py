"""The `ninfer` command line. Every model-running command builds its Program, Frontend and Engine through
`ninfer.wiring.build_runtime` and drives the public Engine path.

Heavy modules are imported inside each command so `ninfer --help` stays instant.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ninfer.convert.quant.recipes import RECIPES
from ninfer.errors import NinferError, NotFoundError

from ninfer.serve.cli_command import GroupedOption, NinferGroup, needs_extra
from ninfer.serve.cli_options import (model_argument, pick_model, runtime_options, serve_limits, serve_options,
                                      show_progress, start_runtime)


@click.group(cls=NinferGroup, context_settings={"help_option_names": ["-h", "--help"],
                                                "auto_envvar_prefix": "NINFER"})
@click.version_option(package_name="ninfer")
def main() -> None:
    """ninfer: an inference engine for the Qwen3.5 family (reference Program on CPU).

    Every model-running command takes the model as MODEL or --model: a .ninfer artifact, an HF checkpoint
    directory (converted once into the cache), or nothing for the embedded random-weight model.
    """


def _existing_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise NotFoundError(f"no such {what} directory").locate(str(path), hint="pass a directory holding "
                                                                              "config.json and *.safetensors")
    return path


@main.command()
@click.argument("src_dir", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", default=None, help="Public model name stored as metadata.name (default: the architecture).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default=None,
              help="Cast weights to this dtype (default: keep the source dtype, value-preserving).")
@click.option("--drafter", "drafter", type=click.Path(path_type=Path), default=None,
              help="A published DFlash / DFlash2 drafter directory to store beside the target (its own bindings).")
@click.option("--quantize", type=click.Choice(RECIPES), default=None,
              help="Quantize an unquantized checkpoint with a recipe (docs/quantization.md); a checkpoint with a "
                   "quantization_config is imported as published without it.")
@click.option("--keep", multiple=True, metavar="PATTERN",
              help="Logical parameters (fnmatch, e.g. 'layers.0.*') the recipe leaves at the source dtype; repeatable.")
@click.option("--group-size", type=int, default=128, show_default=True, help="Group size of the q4/q5 recipes.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
def convert(src_dir: Path, out: Path, name: str | None, dtype: str | None, drafter: Path | None,
            quantize: str | None, keep: tuple[str, ...], group_size: int, no_progress: bool) -> None:
    """Convert an HF checkpoint directory SRC_DIR into one .ninfer artifact OUT."""
    from ninfer.convert.convert import convert_checkpoint

    path = convert_checkpoint(_existing_dir(src_dir, "checkpoint"), out, name=name, dtype=dtype,
                              progress=show_progress(no_progress),
                              drafter=None if drafter is None else _existing_dir(drafter, "drafter"),
                              quantize=quantize, keep=keep, group_size=group_size)
    click.echo(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")


@main.command()
@click.argument("model")
@click.option("--verify", is_flag=True, help="Check every object's checksum; exit 5 naming the first broken one.")
def inspect(model: str, verify: bool) -> None:
    """Print what an artifact holds: config, objects, bindings, bytes by kind. MODEL is a .ninfer file or an HF
    checkpoint directory (its cached conversion is inspected)."""
    from ninfer.convert.inspect import inspect_artifact
    from ninfer.wiring import resolve_model_path

    artifact = resolve_model_path(model, progress=show_progress(False), report=lambda line: click.echo(line, err=True))
    try:
        click.echo(inspect_artifact(artifact, verify=verify))
    except NinferError as e:
        raise e.locate(str(artifact))


def _sampling_flags(max_tokens: int | None, temperature: float | None, top_p: float | None, top_k: int | None,
                    seed: int | None) -> dict:
    """The sampling flags given (None: not given), checked before the model loads."""
    from ninfer.sampling import SamplingParams, SamplingParamsError

    flags = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed}
    try:
        SamplingParams.create(**{k: v for k, v in flags.items() if v is not None})
    except SamplingParamsError as e:
        raise click.BadParameter(str(e), param_hint=f"--{e.field.replace('_', '-')}") from None
    return flags


def _sampling_option(*decls: str, env: str, **kw):
    return click.option(*decls, cls=GroupedOption, help_group="Sampling", default=None, envvar=f"NINFER_{env}",
                        show_envvar=True, **kw)


def _ninfer_option(*decls: str, env: str, **kw):
    return click.option(*decls, cls=GroupedOption, help_group="ninfer", envvar=f"NINFER_{env}", show_envvar=True,
                        **kw)


def _sampling_options(fn):
    for option in reversed([
        _sampling_option("--max-tokens", "-n", env="MAX_TOKENS", type=click.IntRange(1),
                         help="Output tokens [default: 256, or what the context leaves]."),
        _sampling_option("--temperature", env="TEMPERATURE", type=float,
                         help="0 is greedy [default: the model's generation_config, else 0]."),
        _sampling_option("--top-p", env="TOP_P", type=float, help="[default: the model's generation_config, else 1]"),
        _sampling_option("--top-k", env="TOP_K", type=int,
                         help="0 or -1: off [default: the model's generation_config, else 0]."),
        _sampling_option("--request-seed", env="REQUEST_SEED", type=int, help="The sampling seed of this request."),
    ]):
        fn = option(fn)
    return fn


@main.command()
@click.argument("words", metavar="[MODEL] PROMPT", nargs=-1, required=True)
@runtime_options
@_sampling_options
@_ninfer_option("--raw", env="RAW", is_flag=True,
                help="Feed PROMPT as is instead of rendering it as a chat user turn.")
@_ninfer_option("--think/--no-think", env="THINK", default=True, show_default=True,
                help="Render the prompt with thinking on/off.")
def generate(words: tuple[str, ...], runtime: dict, max_tokens: int, temperature: float, top_p: float, top_k: int,
             request_seed: int | None, raw: bool, think: bool) -> None:
    """Generate from PROMPT through the Engine and stream the text (reasoning dimmed, on stderr)."""
    from ninfer.contracts import RequestRejected
    from ninfer.serve.terminal import Printer, cli_sampling, run_turn

    if len(words) > 2:
        raise click.UsageError(f"expected [MODEL] PROMPT, got {len(words)} words: quote the prompt")
    pick_model(runtime, words[0] if len(words) == 2 else None)
    prompt = words[-1]
    flags = _sampling_flags(max_tokens, temperature, top_p, top_k, request_seed)
    rt = start_runtime(runtime, purpose="generation")
    try:
        run_turn(rt, [{"role": "user", "content": prompt}], cli_sampling(rt, flags), {"enable_thinking": think},
                 Printer(), raw=prompt if raw else None)
    except RequestRejected as e:
        raise click.ClickException(f"refused: {e.message}") from None
    finally:
        rt.close()


@main.command()
@model_argument
@runtime_options
@_sampling_options
@_ninfer_option("--think/--no-think", env="THINK", default=True, show_default=True,
                help="Start with thinking on/off.")
def chat(runtime: dict, max_tokens: int, temperature: float, top_p: float, top_k: int, request_seed: int | None,
         think: bool) -> None:
    """Interactive chat with history; /think and /no_think switch thinking, /reset, /exit, /help; Ctrl-C stops a
    reply."""
    from ninfer.serve.chat_repl import chat_loop
    from ninfer.serve.terminal import cli_sampling

    flags = _sampling_flags(max_tokens, temperature, top_p, top_k, request_seed)
    rt = start_runtime(runtime, purpose="generation")
    try:
        chat_loop(rt, cli_sampling(rt, flags), think)
    finally:
        rt.close()


def _frontend_option(*decls: str, env: str, **kw):
    return click.option(*decls, cls=GroupedOption, help_group="Frontend", envvar=f"NINFER_{env}", show_envvar=True,
                        **kw)


def _score_options(fn):
    for option in reversed([
        _ninfer_option("--score-window", env="SCORE_WINDOW", type=click.IntRange(2), default=None,
                       help="Scoring purpose: tokens per window (default 512)."),
        _ninfer_option("--score-stride", env="SCORE_STRIDE", type=click.IntRange(1), default=None,
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
@_ninfer_option("--output", "-o", env="SCORE_OUTPUT", type=click.File("w"), default="-",
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


@main.group()
def oracle() -> None:
    """Differential checks: HF transformers vs the reference Program."""


@oracle.command("hf")
@click.option("--checkpoint", required=True, type=click.Path(path_type=Path),
              help="A local HF checkpoint directory (converted on the fly).")
@click.option("--prompts", default=3, show_default=True, type=click.IntRange(1, 64))
@click.option("--prompt-len", default=80, show_default=True, type=click.IntRange(1, 100000))
@click.option("--decode-steps", default=8, show_default=True, type=click.IntRange(0, 100000))
@click.option("--seed", default=0, show_default=True)
@click.option("--tolerance", default=1e-5, show_default=True)
def oracle_hf(checkpoint: Path, prompts: int, prompt_len: int, decode_steps: int, seed: int, tolerance: float) -> None:
    """Compare the reference model's logits with transformers' on CHECKPOINT; exit 1 over tolerance."""
    with needs_extra("test"):
        import transformers  # noqa: F401 - the oracle's other side

    from oracle.hf import main_hf

    sys.exit(main_hf(_existing_dir(checkpoint, "checkpoint"), num_prompts=prompts, prompt_len=prompt_len,
                     decode_steps=decode_steps, seed=seed, tolerance=tolerance))


@oracle.command("diff")
@click.option("--model", default=None, help="A .ninfer artifact or an HF checkpoint dir (default: the embedded "
                                             "default model).")
@click.option("--prompts", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--prompt-len", default=32, show_default=True, type=click.IntRange(1, 100000))
@click.option("--decode-steps", default=8, show_default=True, type=click.IntRange(0, 100000))
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16", show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: cuda when available.")
@click.option("--kernels", type=click.Choice(["auto", "triton", "naive"]), default="auto", show_default=True,
              help="auto: triton, except naive for bf16 on CPU.")
@click.option("--seed", default=0, show_default=True)
@click.option("--tolerance", default=None, type=float,
              help="Max logits relative RMS [default: 1e-2 bf16 or fp32 Triton on CUDA (TF32), else 1e-4].")
@click.option("--speculative-config", default=None,
              help='JSON, e.g. \'{"method":"mtp","num_speculative_tokens":3}\': compare the fast and reference '
                   "Programs with this backend through the Engine (accepted tokens, acceptance, block logits).")
@click.option("--forced-drafts", is_flag=True,
              help="With --speculative-config: drafts that force every acceptance length (ForcedDrafts).")
def oracle_diff(model: str | None, prompts: int, prompt_len: int, decode_steps: int, dtype: str, device: str,
                kernels: str, seed: int, tolerance: float | None, speculative_config: str | None,
                forced_drafts: bool) -> None:
    """Compare the fast model's logits with the reference model's on MODEL; exit 1 over the thresholds."""
    import torch

    from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeConfigError
    from ninfer.runtime_options import WiringError, parse_json_option
    from ninfer.wiring import resolve_model_path
    from oracle.diff import DTYPES, default_kernels, default_tolerance, main_diff

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    raw = parse_json_option(speculative_config, "--speculative-config")
    try:
        SpeculativeConfig.parse(raw)
    except SpeculativeConfigError as e:
        raise WiringError(str(e)) from None
    path = resolve_model_path(model, progress=show_progress(False), report=lambda line: click.echo(line, err=True))
    kw = dict(prompts=prompts, prompt_len=prompt_len, decode_steps=decode_steps, seed=seed, device=device,
              dtype=DTYPES[dtype])
    if raw is None:
        sys.exit(main_diff(path, kernels=None if kernels == "auto" else kernels, tolerance=tolerance, **kw))
    from oracle.spec_diff import main_spec_diff

    kernels = default_kernels(DTYPES[dtype], device) if kernels == "auto" else kernels
    tolerance = default_tolerance(DTYPES[dtype], device, kernels) if tolerance is None else tolerance
    sys.exit(main_spec_diff(path, raw, kernels=kernels, tolerance=tolerance, forced=forced_drafts, **kw))


if __name__ == "__main__":
    main()
