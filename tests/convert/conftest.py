"""Tiny HF checkpoints for converter tests, built once per session (a few hundred ms each after the first)."""

from __future__ import annotations

import pytest
import torch

from ninfer.testing.checkpoints import make_hf_checkpoint

VARIANTS = {
    "dense": dict(),
    "dense_bf16_sharded_hv1": dict(dtype=torch.bfloat16, sharded=True, hv_per_hk=1),
    "dense_multimodal_tied": dict(multimodal=True, tie=True),
    "moe_per_expert_sharded": dict(moe=True, per_expert=True, sharded=True),
    "moe_fused_multimodal_bf16": dict(moe=True, multimodal=True, dtype=torch.bfloat16),
    "moe_tied_per_expert_nomtp": dict(moe=True, tie=True, per_expert=True, mtp=False),
}


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
