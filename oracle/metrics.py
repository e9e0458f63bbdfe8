"""Error metrics shared by the differential checks."""

from __future__ import annotations

import torch


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative RMS error of ``a`` against the reference ``b``: ``sqrt(mean((a-b)^2)) / sqrt(mean(b^2))`` (fp64)."""
    if a.shape != b.shape:
        raise ValueError(f"rel_rms: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")
    a64, b64 = a.detach().to(torch.float64), b.detach().to(torch.float64)
    denom = b64.pow(2).mean().sqrt()
    if denom == 0:
        raise ValueError("rel_rms: the reference tensor is all zeros")
    return float((a64 - b64).pow(2).mean().sqrt() / denom)


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().to(torch.float64) - b.detach().to(torch.float64)).abs().max())
