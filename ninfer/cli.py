"""The `ninfer` command line: the one place that wires an artifact, a model and a Frontend together.

Heavy modules are imported inside each command so `ninfer --help` stays instant.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click


def _env(name: str) -> str:
    return f"NINFER_{name}"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "NINFER"})
@click.version_option(package_name="ninfer")
def main() -> None:
    """ninfer: an inference engine for the Qwen3.5 family (reference Program on CPU)."""


@main.command()
@click.argument("src_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", default=None, help="Public model name stored as metadata.name (default: the architecture).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default=None,
              help="Cast weights to this dtype (default: keep the source dtype, value-preserving).")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
def convert(src_dir: Path, out: Path, name: str | None, dtype: str | None, no_progress: bool) -> None:
    """Convert an HF checkpoint directory SRC_DIR into one .ninfer artifact OUT."""
    from ninfer.convert.convert import convert_checkpoint

    path = convert_checkpoint(src_dir, out, name=name, dtype=dtype, progress=not no_progress)
    click.echo(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")


@main.command()
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--verify", is_flag=True, help="Check every object's checksum; exit 1 naming the first broken one.")
def inspect(artifact: Path, verify: bool) -> None:
    """Print what an artifact holds: config, objects, bindings, bytes by kind."""
    from ninfer.artifact import ArtifactError
    from ninfer.convert.inspect import inspect_artifact

    try:
        click.echo(inspect_artifact(artifact, verify=verify))
    except ArtifactError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


def _resolve_model(model: str | None) -> Path:
    """A .ninfer file, an HF checkpoint directory (converted once into the cache), or the embedded default."""
    if model is None:
        from ninfer.convert.default_model import default_model_path

        return default_model_path(progress=True)
    p = Path(model)
    if p.is_file():
        return p
    if p.is_dir():
        from ninfer.convert.cached import converted_path

        return converted_path(p)
    raise click.BadParameter(f"{model!r} is neither a .ninfer file nor a checkpoint directory", param_hint="--model")


@main.command()
@click.argument("prompt")
@click.option("--model", "-m", default=None, envvar=_env("MODEL"),
              help="A .ninfer artifact or HF checkpoint dir (default: the embedded random-weight model).")
@click.option("--max-tokens", "-n", default=16, show_default=True, type=click.IntRange(1, 100000))
@click.option("--raw", is_flag=True, help="Feed PROMPT as is instead of rendering it as a chat user turn.")
@click.option("--no-think", is_flag=True, help="Render the generation prompt with thinking off.")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True)
def generate(prompt: str, model: str | None, max_tokens: int, raw: bool, no_think: bool, dtype: str) -> None:
    """Generate greedily from PROMPT with the reference model and stream the text."""
    from ninfer.reference.generate import GreedyGenerator

    gen = GreedyGenerator.load(_resolve_model(model), dtype=dtype)
    if gen.random_weights:
        click.echo(f"[{gen.name}: random weights, the output is noise by design]", err=True)
    ids = gen.encode_prompt(prompt, chat=not raw, enable_thinking=not no_think)
    for piece in gen.stream(ids, max_tokens=max_tokens):
        click.echo(piece, nl=False)
    click.echo()
    click.echo(f"[{gen.stats.summary()}]", err=True)


@main.group()
def oracle() -> None:
    """Differential checks: HF transformers vs the reference Program."""


@oracle.command("hf")
@click.option("--checkpoint", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A local HF checkpoint directory (converted on the fly).")
@click.option("--prompts", default=3, show_default=True, type=click.IntRange(1, 64))
@click.option("--prompt-len", default=80, show_default=True, type=click.IntRange(1, 100000))
@click.option("--decode-steps", default=8, show_default=True, type=click.IntRange(0, 100000))
@click.option("--seed", default=0, show_default=True)
@click.option("--tolerance", default=1e-5, show_default=True)
def oracle_hf(checkpoint: Path, prompts: int, prompt_len: int, decode_steps: int, seed: int, tolerance: float) -> None:
    """Compare the reference model's logits with transformers' on CHECKPOINT; exit 1 over tolerance."""
    from oracle.hf import main_hf

    sys.exit(main_hf(checkpoint, num_prompts=prompts, prompt_len=prompt_len, decode_steps=decode_steps, seed=seed,
                     tolerance=tolerance))


if __name__ == "__main__":
    main()
