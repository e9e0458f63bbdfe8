"""Tiny random Qwen3.5 models for the reference-model tests, built without transformers (fast, fp64-able)."""

from __future__ import annotations

import math

import torch

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.params import logical_parameters
from ninfer.reference.model import ReferenceModel
from ninfer.testing.checkpoints import tiny_text_config


def tiny_config(*, moe: bool = False, tie: bool = False, hv_per_hk: int = 2, num_layers: int = 4) -> Qwen35Config:
    raw = tiny_text_config(moe=moe, tie=tie, hv_per_hk=hv_per_hk, num_layers=num_layers)
    raw.update(model_type="qwen3_5_moe_text" if moe else "qwen3_5_text", mtp_num_hidden_layers=1)
    return Qwen35Config.from_hf(raw)


def random_weights(cfg: Qwen35Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random logical weights with realistic magnitudes: norms near their neutral value, decays spread out."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, spec in logical_parameters(cfg).items():
        if name.endswith("A_log"):
            t = torch.empty(spec.shape).uniform_(1.0, 16.0, generator=g).log()
        elif name.endswith("dt_bias"):
            t = torch.rand(spec.shape, generator=g)
        elif name.endswith("linear_attn.norm.weight"):
            t = 1.0 + 0.1 * torch.randn(spec.shape, generator=g)  # the gated norm's weight is plain, not 1+w
        elif spec.kind == "norm":
            t = 0.1 * torch.randn(spec.shape, generator=g)
        else:
            fan_in = spec.shape[-1]
            t = torch.randn(spec.shape, generator=g) / math.sqrt(fan_in)
        out[name] = t
    if cfg.tie_word_embeddings:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


def tokens(n: int, vocab: int = 512, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))
