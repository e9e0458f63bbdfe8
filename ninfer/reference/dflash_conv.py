"""DFlash2's grouped dynamic depthwise causal convolution around a drafter sublayer (attention or MLP).

    dyn = kernel_projection(h)  viewed [B, 2, taps, groups]      (one projection of the sublayer input; side 0
                                                                 convolves that input, side 1 the sublayer output)
    out[i, c] = sum_t (base[side, t, c] + dyn[i, side, t, c // group_size]) * x[i - t, c]

Tap t reads slot i - t of the same block and nothing before it (the taps are zero across the block boundary), so
a slot sees its predecessors in the block without another backbone pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.models.qwen3_5.drafter import DrafterConfig

from .scope import Scope


def _convolve(x: torch.Tensor, dyn: torch.Tensor, base: torch.Tensor, cfg: DrafterConfig) -> torch.Tensor:
    """x [B, H], dyn [B, taps, groups], base [taps, H] -> [B, H]."""
    B, H = x.shape
    taps, gs = cfg.conv_kernel_size, cfg.conv_group_size
    weight = base[None].to(x.dtype) + dyn.repeat_interleave(gs, dim=-1)  # [B, taps, H]
    out = torch.zeros_like(x)
    for t in range(min(taps, B)):
        out[t:] += weight[t:, t] * x[:B - t]  # slot i reads slot i - t; slots < t have no such predecessor
    return out


def prepare(h: torch.Tensor, w: Scope, cfg: DrafterConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The convolved sublayer input, and the side-1 kernel [B, taps, groups] that `finish` applies."""
    dyn = F.linear(h, w["kernel_projection.weight"]).view(h.shape[0], 2, cfg.conv_kernel_size, cfg.conv_groups)
    return _convolve(h, dyn[:, 0], w["base_kernel"][0], cfg), dyn[:, 1]


def finish(out: torch.Tensor, dyn: torch.Tensor, w: Scope, cfg: DrafterConfig) -> torch.Tensor:
    """The sublayer output convolved with the kernel `prepare` computed from its input."""
    return _convolve(out, dyn, w["base_kernel"][1], cfg)
