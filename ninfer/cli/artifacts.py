"""`ninfer convert` and `ninfer inspect`: making and reading .ninfer artifacts."""

from __future__ import annotations

from pathlib import Path

import click

from ninfer.convert.quant.recipes import RECIPES
from ninfer.errors import NinferError
from ninfer.serve.cli_options import show_progress

from .group import existing_dir, main


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

    path = convert_checkpoint(existing_dir(src_dir, "checkpoint"), out, name=name, dtype=dtype,
                              progress=show_progress(no_progress),
                              drafter=None if drafter is None else existing_dir(drafter, "drafter"),
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
