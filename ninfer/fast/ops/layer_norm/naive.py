"""LayerNorm (mean and variance, weight and bias) with an optional bias added to the residual first, in plain fp32
torch: the vision tower's norms, where the previous projection's bias is folded into the next norm."""

from __future__ import annotations

import torch


def layer_norm_naive(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                     add: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [R, H] (updated in place to ``x + add``, rounded to x's dtype, when ``add`` [H] is given); returns
    ``(x - mean) / sqrt(var + eps) * weight + bias`` [R, H] in x's dtype, into ``out`` when given."""
    if add is not None:
        x.copy_((x.float() + add.float()).to(x.dtype))
    y = torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps).to(x.dtype)
    if out is None:
        return y
    return out.copy_(y)
