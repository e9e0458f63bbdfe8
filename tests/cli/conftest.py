"""Shared CLI fixtures: an in-process runner, the embedded model, a corrupted copy of it, and HF checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ninfer.cli import main

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def run():
    def invoke(*args: str, input: str | None = None, env: dict | None = None):
        return CliRunner().invoke(main, list(args), input=input, env=env, catch_exceptions=False, prog_name="ninfer")
    return invoke


@pytest.fixture(scope="session")
def default_model():
    from ninfer.convert.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def corrupt_model(default_model, tmp_path_factory):
    """The embedded model with one bit flipped inside embed_tokens.weight (its checksum no longer matches)."""
    from ninfer.artifact import open_artifact

    with open_artifact(default_model) as art:
        offset = art.objects["embed_tokens.weight"].offset
    data = bytearray(default_model.read_bytes())
    data[offset + 100] ^= 0x40
    path = tmp_path_factory.mktemp("corrupt") / "corrupt.ninfer"
    path.write_bytes(bytes(data))
    return path


@pytest.fixture(scope="session")
def qwen_checkpoint(tmp_path_factory):
    """A tiny HF checkpoint directory with the real Qwen3.5 vocabulary (no tokenizer files: the built-in ones)."""
    from ninfer.testing.checkpoints import make_hf_checkpoint

    return make_hf_checkpoint(tmp_path_factory.mktemp("ck") / "tiny-qwen", vocab=248320, tie=True, mtp=False,
                              tokenizer=False, dtype=torch.bfloat16)
