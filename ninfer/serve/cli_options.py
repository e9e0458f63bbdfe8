"""The startup flags every model-running command shares, in vLLM's spellings, each mirrored by a NINFER_* variable.

Kept free of heavy imports: `ninfer --help` must stay instant.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import click


def _opt(*decls: str, env: str, **kw: Any) -> Callable:
    return click.option(*decls, envvar=f"NINFER_{env}", show_envvar=True, **kw)


RUNTIME_OPTIONS = [
    _opt("--model", "-m", env="MODEL", default=None,
         help="A .ninfer artifact or HF checkpoint dir (default: the embedded RANDOM-weight model)."),
    _opt("--program", env="PROGRAM", type=click.Choice(["auto", "reference", "fast"]), default="auto",
         show_default=True, help="Which Program runs the model (auto: fast on a GPU, else reference)."),
    _opt("--purpose", env="PURPOSE", type=click.Choice(["generation", "scoring"]), default="generation",
         show_default=True, help="Fixed at start: generation, or CausalScoring (per-token logprobs of texts)."),
    _opt("--served-model-name", "--model-id", "served_model_name", env="SERVED_MODEL_NAME", default=None,
         help="The model id the API reports and accepts (default: the artifact's name)."),
    _opt("--max-model-len", "--context-length", "max_model_len", env="MAX_MODEL_LEN", type=click.IntRange(2),
         default=None, help="Prompt + output tokens per request (default: min(4096, the model's))."),
    _opt("--max-num-seqs", env="MAX_NUM_SEQS", type=click.IntRange(1, 8), default=4, show_default=True,
         help="Concurrent active requests (lanes), fixed at start."),
    _opt("--gpu-memory-utilization", env="GPU_MEMORY_UTILIZATION", type=click.FloatRange(0, 1, min_open=True),
         default=0.9, show_default=True, help="Share of GPU memory the fast Program may plan with."),
    _opt("--enable-prefix-caching/--no-enable-prefix-caching", env="ENABLE_PREFIX_CACHING", default=True,
         show_default=True, help="Reuse exact checkpoints of shared prompt prefixes."),
    _opt("--speculative-config", env="SPECULATIVE_CONFIG", default=None,
         help='JSON, e.g. \'{"method":"mtp","num_speculative_tokens":1}\' (fast Program only).'),
    _opt("--default-chat-template-kwargs", env="DEFAULT_CHAT_TEMPLATE_KWARGS", default=None,
         help='JSON defaults for every chat request, e.g. \'{"enable_thinking": false}\'.'),
    _opt("--seed", env="SEED", type=int, default=None, help="Seed the per-request seeds of unseeded requests."),
    _opt("--dtype", env="DTYPE", type=click.Choice(["float32", "float64"]), default="float32", show_default=True,
         help="Reference Program precision."),
    _opt("--no-progress", env="NO_PROGRESS", is_flag=True, help="Hide the loading progress bars."),
]

RUNTIME_KEYS = ("model", "program", "purpose", "served_model_name", "max_model_len", "max_num_seqs",
                "gpu_memory_utilization", "enable_prefix_caching", "speculative_config",
                "default_chat_template_kwargs", "seed", "dtype", "no_progress")


def runtime_options(fn: Callable) -> Callable:
    """Add the shared flags; the command receives them collected in a `runtime` dict argument."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["runtime"] = {k: kwargs.pop(k) for k in RUNTIME_KEYS}
        return fn(*args, **kwargs)

    for option in reversed(RUNTIME_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def start_runtime(flags: dict, *, purpose: str | None = None, warmup: bool = True, **extra: Any):
    """Build the Runtime from the collected flags, turning bad options into a clean click error."""
    from ninfer.wiring import RuntimeOptions, WiringError, build_runtime, parse_json_option

    try:
        options = RuntimeOptions(
            model=flags["model"], program=flags["program"], purpose=purpose or flags["purpose"],
            served_model_name=flags["served_model_name"], max_model_len=flags["max_model_len"],
            max_num_seqs=flags["max_num_seqs"], gpu_memory_utilization=flags["gpu_memory_utilization"],
            enable_prefix_caching=flags["enable_prefix_caching"],
            speculative_config=parse_json_option(flags["speculative_config"], "--speculative-config"),
            default_chat_template_kwargs=parse_json_option(flags["default_chat_template_kwargs"],
                                                           "--default-chat-template-kwargs") or {},
            seed=flags["seed"], dtype=flags["dtype"], warmup=warmup, **extra)
        rt = build_runtime(options, progress=not flags["no_progress"])
    except WiringError as e:
        raise click.ClickException(str(e)) from None
    click.echo(rt.summary(), err=True)
    return rt
