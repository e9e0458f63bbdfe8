"""SwiGLU activation on a fused gate/up projection output, in plain fp32 torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu_naive(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] = [gate | up] -> silu(gate) * up [..., I] in x's dtype."""
    gate, up = x.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)
