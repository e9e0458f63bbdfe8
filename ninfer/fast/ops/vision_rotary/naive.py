"""The vision tower's 2D rotary (rotate_half over the whole head) on q and k of one qkv projection, in place, in
fp32 as transformers' ``apply_rotary_pos_emb_vision`` computes it, rounded back to the io dtype."""

from __future__ import annotations

import torch


def vision_rotary_naive(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """qkv [N, 3, nh, d] (q, k, v; a view of the projection's output): q and k rotated in place. cos, sin
    [L, d/2] fp32: row n of qkv takes table row n % L (the frames of one image share a grid)."""
    N, _, _, d = qkv.shape
    reps = N // cos.shape[0]
    c, s = cos.repeat(reps, 1)[:, None, None], sin.repeat(reps, 1)[:, None, None]  # [N, 1, 1, d/2]
    x = qkv[:, :2].float()
    a, b = x[..., :d // 2], x[..., d // 2:]
    qkv[:, :2] = torch.cat([a * c - b * s, b * c + a * s], dim=-1).to(qkv.dtype)
