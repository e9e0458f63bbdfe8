"""Decode GEMV (``F.linear`` without bias) and its fused forms (SwiGLU epilogue, RMSNorm prologue, residual
epilogue), in plain fp32 torch, rounding where the unfused ops would store."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.fast.ops.rmsnorm.naive import rmsnorm_naive


def _normed(x: torch.Tensor, norm_weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    return x if norm_weight is None else rmsnorm_naive(x, norm_weight, eps)[0]


def gemv_naive(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
               residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T -> [M, N] in x's dtype, accumulated in fp32. ``norm_weight`` [K]: x normed first
    (zero-centred RMSNorm, as ``rmsnorm_naive``); ``residual`` [M, N]: returns residual + the rounded product."""
    y = F.linear(_normed(x, norm_weight, eps).float(), w.float()).to(x.dtype)
    return y if residual is None else (y.float() + residual.float()).to(residual.dtype)


def gemv_swiglu_naive(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None = None,
                      eps: float = 0.0) -> torch.Tensor:
    """w [2I, K] = [gate | up] rows: silu(x @ gate^T) * (x @ up^T) -> [M, I] in x's dtype, one rounding at the end
    (the fused kernel never stores the [M, 2I] projection); ``norm_weight`` as for ``gemv_naive``."""
    gate, up = F.linear(_normed(x, norm_weight, eps).float(), w.float()).chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)
