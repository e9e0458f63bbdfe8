"""`ninfer generate` and `ninfer chat`: one prompt, or an interactive conversation, through the Engine."""

from __future__ import annotations

import functools

import click

from ninfer.serve.cli_command import grouped_option
from ninfer.serve.cli_options import model_argument, pick_model, runtime_options, start_runtime

from .group import main, ninfer_option


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


_sampling_option = functools.partial(grouped_option, group="Sampling", default=None)


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
@ninfer_option("--raw", env="RAW", is_flag=True,
               help="Feed PROMPT as is instead of rendering it as a chat user turn.")
@ninfer_option("--think/--no-think", env="THINK", default=True, show_default=True,
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
@ninfer_option("--think/--no-think", env="THINK", default=True, show_default=True,
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
