"""The startup flags every model-running command shares, in vLLM's spellings, each mirrored by a NINFER_* variable.

Kept free of heavy imports: `ninfer --help` must stay instant.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import click
from click.core import ParameterSource

from ninfer.engine.config import EngineConfig
from ninfer.errors import UsageError
from ninfer.pipeline import parse_devices, parse_stage_layers
from ninfer.serve import limits as L

from .cli_command import grouped_option as _opt


_SECONDS_R = click.FloatRange(0, min_open=True)

RUNTIME_OPTIONS = [
    _opt("--model", "-m", env="MODEL", group="ModelConfig", default=None,
         help="A .ninfer artifact or HF checkpoint dir, like the positional MODEL "
              "(default: the embedded RANDOM-weight model)."),
    _opt("--served-model-name", "--model-id", "served_model_name", env="SERVED_MODEL_NAME", group="ModelConfig",
         default=None, help="The model id the API reports and accepts (default: the artifact's name)."),
    _opt("--max-model-len", "--context-length", "max_model_len", env="MAX_MODEL_LEN", group="ModelConfig",
         type=click.IntRange(2), default=None, help="Prompt + output tokens per request (default: min(4096, the "
                                                    "model's))."),
    _opt("--generation-config", env="GENERATION_CONFIG", group="ModelConfig", default="auto", show_default=True,
         help="Sampling defaults where a request sets none: auto (the model's generation_config.json), none (plain "
              "defaults; vLLM's 'vllm' too), or a directory or file holding a generation_config.json."),
    _opt("--dtype", env="DTYPE", group="ModelConfig", type=click.Choice(["float32", "float64"]), default="float32",
         show_default=True, help="Reference Program precision."),
    _opt("--seed", env="SEED", group="ModelConfig", type=int, default=None,
         help="Seed the per-request seeds of unseeded requests."),
    _opt("--enforce-eager", env="ENFORCE_EAGER", group="ModelConfig", is_flag=True,
         help="Fast Program: capture no CUDA graphs, run every step eagerly (where capture fails on a driver or "
              "GPU, or to debug; slower decoding). The reference Program captures none anyway."),
    _opt("--gpu-memory-utilization", env="GPU_MEMORY_UTILIZATION", group="CacheConfig",
         type=click.FloatRange(0, 1, min_open=True), default=0.9, show_default=True,
         help="Share of GPU memory the fast Program may plan with."),
    _opt("--enable-prefix-caching/--no-enable-prefix-caching", env="ENABLE_PREFIX_CACHING", group="CacheConfig",
         default=True, show_default=True, help="Reuse exact checkpoints of shared prompt prefixes."),
    _opt("--cache-device-share", env="CACHE_DEVICE_SHARE", group="CacheConfig",
         type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
         help="Share of the KV page pool inactive prefix-cache checkpoints may hold; past it the lowest-valued "
              "are deleted (1: only admissions displace them)."),
    _opt("--kv-offloading-size", env="KV_OFFLOADING_SIZE", group="CacheConfig", type=click.FloatRange(0),
         default=4.0, show_default=True,
         help="GiB of host memory for checkpoint replicas demoted from the device (0: no host tier)."),
    _opt("--max-num-seqs", env="MAX_NUM_SEQS", group="SchedulerConfig", type=click.IntRange(1, 8), default=4,
         show_default=True, help="Concurrent active requests (lanes), fixed at start."),
    _opt("--concurrent-prefill/--no-concurrent-prefill", env="CONCURRENT_PREFILL", group="SchedulerConfig",
         default=False, show_default=True,
         help="Admit a request while another is still prefilling (several staged prefills at once)."),
    _opt("--async-scheduling/--no-async-scheduling", env="ASYNC_SCHEDULING", group="SchedulerConfig", default=None,
         help="Launch the next decode round on the device before the host has committed the current one "
              "(host/GPU overlap; masked and speculative rounds stay synchronous). Default: on for the fast "
              "Program."),
    _opt("--devices", env="DEVICES", group="ParallelConfig", default=None,
         help="Pipeline stages, one per device: the model is cut by layers, rank 0 keeps the embedding, head, "
              "sampling and MTP (docs/pipeline.md). CUDA ordinals (0,1) or cpu,cpu (the reference Program's "
              "stages). Default: one device."),
    _opt("--stage-layers", env="STAGE_LAYERS", group="ParallelConfig", default=None,
         help="Layers per stage with --devices, e.g. 20,20 (default: balanced by weight bytes)."),
    _opt("--speculative-config", env="SPECULATIVE_CONFIG", group="SpeculativeConfig", default=None,
         help='JSON, e.g. \'{"method":"mtp","num_speculative_tokens":3}\' (k in 1..7; both Programs), or method '
              '"dflash" / "dflash2" with k in 1..15 (block k+1) and an optional "draft_window_size" (both '
              'Programs, with a drafter converted beside the target). "adaptive": false drafts the full block '
              'every round (default true: fewer drafts, down to none, where the measured round costs and the '
              'acceptance so far say so); "draft_vocab_size": N drafts from the token ids below N alone (a '
              'smaller draft lm_head); "quantization": "fp8" (MTP) drafts with the MTP head\'s projections in '
              'FP8.'),
    _opt("--default-chat-template-kwargs", env="DEFAULT_CHAT_TEMPLATE_KWARGS", group="Frontend", default=None,
         help='JSON defaults for every chat request, e.g. \'{"enable_thinking": false}\'.'),
    _opt("--json-whitespace", env="JSON_WHITESPACE", group="Frontend", type=click.Choice(["compact", "pretty"]),
         default="compact", show_default=True,
         help="The layout of JSON answers (json_object, json_schema) where a request names none: compact (one "
              "line) or pretty (indented, at most 20 whitespace characters in a row)."),
    _opt("--thinking-token-budget", env="THINKING_TOKEN_BUDGET", group="Frontend", type=click.IntRange(0),
         default=None, help="Reasoning tokens before a forced </think>, where a request sets none (default: no "
                            "limit)."),
    _opt("--limit-mm-per-prompt", env="LIMIT_MM_PER_PROMPT", group="MultiModalConfig", default=None,
         help='Images per prompt at most: a count or \'{"image": N}\' (default 8; 0: images are refused and the '
              'vision tower is not loaded).'),
    _opt("--allowed-local-media-path", env="ALLOWED_LOCAL_MEDIA_PATH", group="MultiModalConfig", default=None,
         help="A directory image URLs may name files under (file:///DIR/x.png); nothing outside it, through .. or "
              "symlinks, is read (default: no local files)."),
    _opt("--allow-remote-media/--no-allow-remote-media", env="ALLOW_REMOTE_MEDIA", group="MultiModalConfig",
         default=False, show_default=True, help="Fetch http(s) image URLs (with --media-fetch-timeout and "
                                                "--media-max-bytes)."),
    _opt("--media-max-bytes", env="MEDIA_MAX_BYTES", group="MultiModalConfig", type=click.IntRange(1),
         default=20 << 20, show_default=True, help="Encoded bytes of one image at most."),
    _opt("--media-max-pixels", env="MEDIA_MAX_PIXELS", group="MultiModalConfig", type=click.IntRange(1),
         default=64 << 20, show_default=True, help="Decoded pixels of one image at most (checked before decoding)."),
    _opt("--media-fetch-timeout", env="MEDIA_FETCH_TIMEOUT", group="MultiModalConfig", type=_SECONDS_R,
         default=10.0, show_default=True, help="Seconds one remote image may take to fetch."),
    _opt("--program", env="PROGRAM", group="ninfer", type=click.Choice(["auto", "reference", "fast"]),
         default="auto", show_default=True, help="Which Program runs the model (auto: fast on a GPU, else "
                                                 "reference)."),
    _opt("--purpose", env="PURPOSE", group="ninfer", type=click.Choice(["generation", "scoring"]),
         default="generation", show_default=True,
         help="Fixed at start: generation, or CausalScoring (per-token logprobs of texts)."),
    _opt("--no-progress", env="NO_PROGRESS", group="ninfer", is_flag=True,
         help="Hide the loading and conversion progress bars (shown only on a terminal)."),
]

RUNTIME_KEYS = ("model", "program", "purpose", "served_model_name", "max_model_len", "max_num_seqs",
                "gpu_memory_utilization", "enable_prefix_caching", "cache_device_share", "kv_offloading_size",
                "concurrent_prefill", "async_scheduling", "enforce_eager", "speculative_config", "devices",
                "stage_layers", "default_chat_template_kwargs", "seed", "dtype", "no_progress", "generation_config",
                "json_whitespace", "thinking_token_budget", "limit_mm_per_prompt", "allowed_local_media_path",
                "allow_remote_media", "media_max_bytes", "media_max_pixels", "media_fetch_timeout")


def runtime_options(fn: Callable) -> Callable:
    """Add the shared flags; the command receives them collected in a `runtime` dict argument."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["runtime"] = {k: kwargs.pop(k) for k in RUNTIME_KEYS}
        if "model_arg" in kwargs:
            pick_model(kwargs["runtime"], kwargs.pop("model_arg"))
        return fn(*args, **kwargs)

    for option in reversed(RUNTIME_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


_SECONDS = click.FloatRange(0, min_open=True)

# `ninfer serve` only: the Engine's queue (RuntimeOptions) and the Gateway's limits (ninfer.serve.limits).
SERVE_OPTIONS = [
    _opt("--max-queued-requests", env="MAX_QUEUED_REQUESTS", group="SchedulerConfig", type=click.IntRange(0),
         default=EngineConfig.queue_bound, show_default=True,
         help="Choices waiting for a lane beyond --max-num-seqs; one more is refused with 429."),
    _opt("--queue-timeout", env="QUEUE_TIMEOUT", group="SchedulerConfig", type=_SECONDS, default=None,
         help="Seconds a choice may wait for a lane before it is refused with 503 (default: no limit)."),
    _opt("--request-timeout", env="REQUEST_TIMEOUT", group="Frontend", type=_SECONDS, default=None,
         help="Seconds of queue plus run per request: a running one ends with its output so far (finish_reason "
              "length), a waiting one with 503 queue_timeout (default: no limit)."),
    _opt("--max-request-body-bytes", env="MAX_REQUEST_BODY_BYTES", group="Frontend", type=click.IntRange(1),
         default=L.MAX_BODY_BYTES, show_default=True,
         help="Larger request bodies are refused with 413 before they are parsed."),
    _opt("--header-read-timeout", env="HEADER_READ_TIMEOUT", group="Frontend", type=_SECONDS,
         default=L.HEADER_READ_TIMEOUT_S, show_default=True,
         help="Seconds from a connection's opening or a request's first byte to its last header (else 408)."),
    _opt("--body-read-timeout", env="BODY_READ_TIMEOUT", group="Frontend", type=_SECONDS,
         default=L.BODY_READ_TIMEOUT_S, show_default=True,
         help="Seconds from the headers to the body's last byte (else 408)."),
    _opt("--limit-concurrency", env="LIMIT_CONCURRENCY", group="Frontend", type=click.IntRange(1),
         default=L.LIMIT_CONCURRENCY, show_default=True,
         help="Open connections at most; one more is answered 503 and closed."),
    _opt("--h11-max-incomplete-event-size", env="H11_MAX_INCOMPLETE_EVENT_SIZE", group="Frontend",
         type=click.IntRange(1024), default=L.MAX_HEADER_BYTES, show_default=True,
         help="Bytes of request line plus headers at most (else 400)."),
    _opt("--max-schema-bytes", env="MAX_SCHEMA_BYTES", group="Frontend", type=click.IntRange(1),
         default=L.MAX_SCHEMA_BYTES, show_default=True,
         help="response_format plus tools as compact JSON at most (else 400 schema_too_large)."),
    _opt("--grammar-compile-timeout", env="GRAMMAR_COMPILE_TIMEOUT", group="Frontend", type=_SECONDS,
         default=L.COMPILE_TIMEOUT_S, show_default=True,
         help="Seconds one structured-output grammar may compile (else 400; its worker process is killed)."),
    _opt("--shutdown-timeout", env="SHUTDOWN_TIMEOUT", group="Frontend", type=click.FloatRange(0),
         default=L.SHUTDOWN_TIMEOUT_S, show_default=True,
         help="On SIGTERM, seconds in-flight requests may finish before they are cancelled."),
    _opt("--exit-on-engine-failure/--no-exit-on-engine-failure", env="EXIT_ON_ENGINE_FAILURE", group="Frontend",
         default=True, show_default=True,
         help="Exit with status 1 when the Engine fails, so that a supervisor restarts the server."),
]

SERVE_KEYS = ("max_queued_requests", "queue_timeout", "request_timeout", "max_request_body_bytes",
              "header_read_timeout", "body_read_timeout", "limit_concurrency", "h11_max_incomplete_event_size",
              "max_schema_bytes", "grammar_compile_timeout", "shutdown_timeout", "exit_on_engine_failure")


def serve_options(fn: Callable) -> Callable:
    """Add `ninfer serve`'s limit flags; the command receives them collected in a `limits` dict argument."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["limits"] = {k: kwargs.pop(k) for k in SERVE_KEYS}
        return fn(*args, **kwargs)

    for option in reversed(SERVE_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def serve_limits(flags: dict) -> L.ServeLimits:
    """The Gateway's ServeLimits from the collected serve flags (the Engine's go to RuntimeOptions)."""
    try:
        return L.ServeLimits(
            max_body_bytes=flags["max_request_body_bytes"], header_read_timeout=flags["header_read_timeout"],
            body_read_timeout=flags["body_read_timeout"], limit_concurrency=flags["limit_concurrency"],
            max_header_bytes=flags["h11_max_incomplete_event_size"], max_schema_bytes=flags["max_schema_bytes"],
            request_timeout=flags["request_timeout"], shutdown_timeout=flags["shutdown_timeout"],
            exit_on_engine_failure=flags["exit_on_engine_failure"])
    except L.LimitError as e:
        raise UsageError(str(e)) from None


# `ninfer serve MODEL`, as vLLM users type it; --model (or NINFER_MODEL) stays.
model_argument = click.argument("model_arg", metavar="[MODEL]", required=False)


def pick_model(flags: dict, positional: str | None) -> None:
    """Settle the model named by a positional MODEL and/or --model: the positional wins over NINFER_MODEL, and
    naming two different models on the command line is a usage error."""
    if positional is None:
        return
    given = flags["model"]
    source = click.get_current_context().get_parameter_source("model")
    if given is not None and source is ParameterSource.COMMANDLINE and not _same_path(given, positional):
        raise UsageError(f"two models named: {positional!r} and --model {given!r}").locate(
            "MODEL, --model", hint="name the model once, as the positional MODEL or with --model")
    flags["model"] = positional


def _same_path(a: str, b: str) -> bool:
    from pathlib import Path

    return Path(a).resolve() == Path(b).resolve()


def show_progress(no_progress: bool) -> bool:
    """Progress bars go to a terminal only: a log file or a pipe gets the one-line notes, not bar redraws."""
    return not no_progress and sys.stderr.isatty()


def start_runtime(flags: dict, *, purpose: str | None = None, warmup: bool = True, announce: bool = True,
                  **extra: Any):
    """Build the Runtime from the collected flags; a bad option or model raises a NinferError (one line).

    `purpose` is the command's own (generate and chat generate, score scores): a --purpose that says otherwise is
    refused rather than ignored. `announce` prints the ready line (serve prints its own, with the address)."""
    from ninfer.runtime_options import RuntimeOptions, parse_image_limit, parse_json_option
    from ninfer.wiring import build_runtime

    if purpose is not None and flags["purpose"] != purpose and _given("purpose"):
        command = click.get_current_context().info_name
        raise UsageError(f"`ninfer {command}` runs the {purpose} purpose, not {flags['purpose']}").locate(
            "--purpose", hint="drop --purpose (or NINFER_PURPOSE): only `ninfer serve` picks its purpose; "
                              "`ninfer score` scores texts")

    options = RuntimeOptions(
        model=flags["model"], program=flags["program"], purpose=purpose or flags["purpose"],
        served_model_name=flags["served_model_name"], max_model_len=flags["max_model_len"],
        max_num_seqs=flags["max_num_seqs"], gpu_memory_utilization=flags["gpu_memory_utilization"],
        enable_prefix_caching=flags["enable_prefix_caching"], cache_device_share=flags["cache_device_share"],
        kv_offloading_size=flags["kv_offloading_size"], concurrent_prefill=flags["concurrent_prefill"],
        async_scheduling=flags["async_scheduling"], enforce_eager=flags["enforce_eager"],
        speculative_config=parse_json_option(flags["speculative_config"], "--speculative-config"),
        default_chat_template_kwargs=parse_json_option(flags["default_chat_template_kwargs"],
                                                       "--default-chat-template-kwargs") or {},
        seed=flags["seed"], dtype=flags["dtype"], generation_config=flags["generation_config"],
        json_whitespace=flags["json_whitespace"], thinking_token_budget=flags["thinking_token_budget"],
        limit_mm_per_prompt=parse_image_limit(flags["limit_mm_per_prompt"]),
        allowed_local_media_path=flags["allowed_local_media_path"], allow_remote_media=flags["allow_remote_media"],
        media_max_bytes=flags["media_max_bytes"], media_max_pixels=flags["media_max_pixels"],
        media_fetch_timeout=flags["media_fetch_timeout"], devices=_devices(flags), warmup=warmup,
        stage_layers=None if flags["stage_layers"] is None else parse_stage_layers(flags["stage_layers"]), **extra)
    rt = build_runtime(options, progress=show_progress(flags["no_progress"]),
                       report=lambda line: click.echo(line, err=True))
    if announce:
        click.echo(rt.summary(), err=True)
    return rt


def _devices(flags: dict) -> tuple[str, ...] | None:
    """--devices parsed once; --stage-layers without it is refused (there is one stage)."""
    if flags["devices"] is None:
        if flags["stage_layers"] is not None:
            raise UsageError("--stage-layers cuts the model across --devices; with one device there is one stage")
        return None
    return parse_devices(flags["devices"])


def _given(name: str) -> bool:
    """Whether the user set option `name` (on the command line or through its NINFER_* variable)."""
    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)
