"""Zero-centred RMSNorm with an optional fused residual add, in plain fp32 torch."""

from __future__ import annotations

import torch


def rmsnorm_naive(x: torch.Tensor, weight: torch.Tensor, eps: float,
                  residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` (rounded to the io dtype, like an unfused add), ``y = h / rms(h) * (1 + w)``.

    x, residual [..., H]; weight [H]. Returns (y, h), both in x's dtype; h is x itself without a residual.
    """
    h = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    return y.to(x.dtype), h
