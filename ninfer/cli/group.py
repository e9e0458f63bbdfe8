"""The `ninfer` click group every subcommand module registers on, and the options they share."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from ninfer.errors import NotFoundError
from ninfer.serve.cli_command import NinferGroup, grouped_option


@click.group(cls=NinferGroup, context_settings={"help_option_names": ["-h", "--help"],
                                                "auto_envvar_prefix": "NINFER"})
@click.version_option(package_name="ninfer")
def main() -> None:
    """ninfer: an inference engine for the Qwen3.5 family (reference Program on CPU).

    Every model-running command takes the model as MODEL or --model: a .ninfer artifact, an HF checkpoint
    directory (converted once into the cache), or nothing for the embedded random-weight model.
    """


def existing_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise NotFoundError(f"no such {what} directory").locate(str(path), hint="pass a directory holding "
                                                                              "config.json and *.safetensors")
    return path


ninfer_option = functools.partial(grouped_option, group="ninfer")
