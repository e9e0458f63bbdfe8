"""DFlash2's grouped dynamic depthwise causal convolution over packed draft blocks, in plain fp32 torch.

    out[n, c] = sum_{t < taps, t <= n % B} (base[t, c] + dyn[n, t, c // group]) * x[n - t, c]

Rows n are blocks of B slots packed one after another (slot n % B of block n // B); a tap never reads across a
block's start. `ninfer.reference.dflash_conv` is the same formula on one block.
"""

from __future__ import annotations

import torch


def dflash_conv_naive(x: torch.Tensor, dyn: torch.Tensor, base: torch.Tensor, block: int) -> torch.Tensor:
    """x [N, H] (N a multiple of `block`), dyn [N, taps, G] (G = H / group), base [taps, H] -> [N, H] in x's
    dtype."""
    N, H = x.shape
    taps, G = dyn.shape[1], dyn.shape[2]
    xf = x.float()
    weight = base.float()[None] + dyn.float().repeat_interleave(H // G, dim=-1)  # [N, taps, H]
    slot = torch.arange(N, device=x.device) % block
    out = torch.zeros(N, H, dtype=torch.float32, device=x.device)
    for t in range(taps):
        shifted = torch.cat([torch.zeros(t, H, dtype=torch.float32, device=x.device), xf[:N - t]])[:N]
        out += torch.where((slot >= t)[:, None], weight[:, t] * shifted, 0.0)
    return out.to(x.dtype)
