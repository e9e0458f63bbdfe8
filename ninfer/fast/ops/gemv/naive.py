"""Decode GEMV (``F.linear`` without bias) and its SwiGLU-fused form, in plain fp32 torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gemv_naive(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T -> [M, N] in x's dtype, accumulated in fp32."""
    return F.linear(x.float(), w.float()).to(x.dtype)


def gemv_swiglu_naive(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """w [2I, K] = [gate | up] rows: silu(x @ gate^T) * (x @ up^T) -> [M, I] in x's dtype, one rounding at the end
    (the fused kernel never stores the [M, 2I] projection)."""
    gate, up = F.linear(x.float(), w.float()).chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)
