"""Tiny HF checkpoints for converter tests, built once per session (a few hundred ms each after the first)."""

from __future__ import annotations

import pytest

from ninfer.testing.checkpoints import VARIANTS, make_hf_checkpoint


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return {name: make_hf_checkpoint(root / name, **kw) for name, kw in VARIANTS.items()}


@pytest.fixture()
def fresh_checkpoint(tmp_path):
    """A private checkpoint a test may damage."""
    def make(**kw):
        return make_hf_checkpoint(tmp_path / "ckpt", **kw)
    return make
