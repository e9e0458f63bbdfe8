"""RMSNorm variants of Qwen3.5: the zero-centred ``(1 + w)`` norm and the GDN output's gated norm.

Both normalise in at least fp32 (HF computes every norm in fp32) and return the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # fp64 inputs stay fp64 (the fp64 oracle mode); anything narrower is lifted to fp32 like HF does.
    return torch.float64 if dtype == torch.float64 else torch.float32


def zc_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * (1 + w)`` over the last dim; weights are stored zero-centred (init 0)."""
    ct = _compute_dtype(x.dtype)
    xf = x.to(ct)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    # HF multiplies by (1 + w) before casting back, not after.
    return (y * (1.0 + weight.to(ct))).to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm over the last dim: ``(w * x / rms(x)) * silu(gate)`` with a plain (not 1+w) weight."""
    ct = _compute_dtype(x.dtype)
    xf = x.to(ct)
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = weight.to(x.dtype) * y
    return (y * F.silu(gate.to(ct))).to(x.dtype)
