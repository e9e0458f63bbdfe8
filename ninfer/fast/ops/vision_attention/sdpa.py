"""The vision tower's attention through torch's fused ``scaled_dot_product_attention`` backends (flash, cuDNN,
memory-efficient) as a batch of equal frames: one encode is one image or video, whose frames share one grid, so
the block-diagonal mask is a batch dimension and no Python loop or mask tensor is needed. q, k, v stay strided
views of the qkv projection; the backends take any row stride with a contiguous head dim. The result is the
backend's own [N, nh, d] tensor from the caching allocator (none of them writes into a given buffer)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def frames_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, frame_len: int, backend: str) -> torch.Tensor:
    """q, k, v [N, nh, d] with N = frames * frame_len; attention within each frame -> [N, nh, d] (a view)."""
    N, nh, d = q.shape
    qb, kb, vb = (t.view(N // frame_len, frame_len, nh, d).transpose(1, 2) for t in (q, k, v))  # [F, nh, L, d]
    with sdpa_kernel([BACKENDS[backend]]):
        o = F.scaled_dot_product_attention(qb, kb, vb)
    return o.transpose(1, 2).reshape(N, nh, d)
