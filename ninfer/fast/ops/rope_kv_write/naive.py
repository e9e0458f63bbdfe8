"""Attention input preparation in plain fp32 torch: optional zero-centred q/k RMSNorm, partial NeoX RoPE on the first
``rotary_dim`` dims of every head, and the write of the new keys/values into their KV-cache page slots."""

from __future__ import annotations

import torch


def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """[rotary_dim/2] fp32 inverse frequencies, computed exactly as HF does, so kernel angles match bit for bit."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))


def _norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if weight is None:
        return x
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())


def _rope(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    # x [T, heads, d] fp32; NeoX rotate_half on the first rotary_dim dims, the rest pass through
    angles = positions.float()[:, None] * rope_inv_freq(rotary_dim, theta, x.device)[None, :]  # [T, rd/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :]
    rot = x[..., :rotary_dim]
    a, b = rot.chunk(2, dim=-1)
    return torch.cat([rot * cos + torch.cat([-b, a], -1) * sin, x[..., rotary_dim:]], dim=-1)


def rope_kv_write_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                        slot_mapping: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, rotary_dim: int,
                        theta: float, q_norm_weight: torch.Tensor | None = None,
                        k_norm_weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """q [T, nh, d], k/v [T, nkv, d], positions [T], slot_mapping [T] (flat slot = page * page_size + offset; -1
    writes nothing). Writes rotated k and v into k_pages/v_pages [P, page_size, nkv, d]; returns the rotated q."""
    page_size = k_pages.shape[1]
    qr = _rope(_norm(q.float(), q_norm_weight, eps), positions, rotary_dim, theta)
    kr = _rope(_norm(k.float(), k_norm_weight, eps), positions, rotary_dim, theta)
    for t in range(q.shape[0]):
        slot = int(slot_mapping[t])
        if slot >= 0:
            k_pages[slot // page_size, slot % page_size] = kr[t].to(k_pages.dtype)
            v_pages[slot // page_size, slot % page_size] = v[t].to(v_pages.dtype)
    return qr.to(q.dtype)
