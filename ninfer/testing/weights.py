"""Random test weights keyed by logical parameter name (no checkpoint on disk): standard-normal ones, and fp32 ones
with peaked logits for the parity tests that compare greedy tokens of two implementations."""

from __future__ import annotations

import math

import torch

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.params import logical_parameters


def random_logical_tensors(cfg: Qwen35Config, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                           features: tuple[str, ...] = ("text", "mtp")) -> dict[str, torch.Tensor]:
    """Standard-normal tensors for every logical parameter (fp32-kind ones in fp32), keyed by logical name."""
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s.shape, generator=g).to(torch.float32 if s.kind == "fp32" else dtype)
            for n, s in logical_parameters(cfg, features).items()}


def peaked_text_tensors(cfg: Qwen35Config, seed: int = 0, features: tuple[str, ...] = ("text",)
                        ) -> dict[str, torch.Tensor]:
    """fp32 text weights (and the MTP head's with `features=("text", "mtp")`) with peaked logits, so that greedy
    tokens of two implementations are not near-ties: decay rates exp(A_log) in [1, 16], gated-norm weights near 1,
    other norms near 0, projections of std 2/sqrt(fan_in)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, spec in logical_parameters(cfg, features).items():
        if name.endswith("A_log"):
            t = torch.empty(spec.shape).uniform_(1.0, 16.0, generator=g).log()
        elif name.endswith("dt_bias"):
            t = torch.rand(spec.shape, generator=g)
        elif name.endswith("linear_attn.norm.weight"):
            t = 1.0 + 0.1 * torch.randn(spec.shape, generator=g)
        elif spec.kind == "norm":
            t = 0.1 * torch.randn(spec.shape, generator=g)
        else:
            t = 2.0 * torch.randn(spec.shape, generator=g) / math.sqrt(spec.shape[-1])
        out[name] = t
    return out
