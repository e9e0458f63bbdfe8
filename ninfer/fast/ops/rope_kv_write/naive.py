"""Attention input preparation in plain fp32 torch: optional zero-centred q/k RMSNorm, partial NeoX RoPE on the first
``rotary_dim`` dims of every head, and the write of the new keys/values into their KV-cache page slots.

Positions are one row [T] (text: MRoPE's three rows are equal), or the three MRoPE rows [3, T] of a prompt with
images, each frequency taking its angle from the row ``mrope_rows`` assigns (interleaved by ``mrope_section``)."""

from __future__ import annotations

import torch


def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """[rotary_dim/2] fp32 inverse frequencies, computed exactly as HF does, so kernel angles match bit for bit."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))


def _norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if weight is None:
        return x
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())


def mrope_rows(pairs: int, section) -> torch.Tensor:
    """The position row (0 T, 1 H, 2 W) of each frequency: H where i % 3 == 1 and i < 3 * section[1], W where
    i % 3 == 2 and i < 3 * section[2], else T (transformers' interleaved MRoPE)."""
    rows = torch.zeros(pairs, dtype=torch.long)
    for row in (1, 2):
        rows[row:3 * section[row]:3] = row
    return rows


def _rope(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float, section=None) -> torch.Tensor:
    # x [T, heads, d] fp32; NeoX rotate_half on the first rotary_dim dims, the rest pass through
    inv = rope_inv_freq(rotary_dim, theta, x.device)
    if positions.ndim == 2:  # [3, T]: each frequency reads its MRoPE row
        rows = mrope_rows(rotary_dim // 2, section).to(x.device)
        angles = positions.float()[rows].t() * inv[None, :]  # [T, rd/2]
    else:
        angles = positions.float()[:, None] * inv[None, :]  # [T, rd/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :]
    rot = x[..., :rotary_dim]
    a, b = rot.chunk(2, dim=-1)
    return torch.cat([rot * cos + torch.cat([-b, a], -1) * sin, x[..., rotary_dim:]], dim=-1)


def rope_kv_write_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                        slot_mapping: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, rotary_dim: int,
                        theta: float, q_norm_weight: torch.Tensor | None = None,
                        k_norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                        mrope_section=None) -> torch.Tensor:
    """q [T, nh, d], k/v [T, nkv, d], positions [T] (or [3, T] with ``mrope_section``), slot_mapping [T] (flat slot
    = page * page_size + offset; -1 writes nothing). Writes rotated k and v into k_pages/v_pages [P, page_size, nkv,
    d]; returns the rotated q."""
    page_size = k_pages.shape[1]
    qr = _rope(_norm(q.float(), q_norm_weight, eps), positions, rotary_dim, theta, mrope_section)
    kr = _rope(_norm(k.float(), k_norm_weight, eps), positions, rotary_dim, theta, mrope_section)
    for t in range(q.shape[0]):
        slot = int(slot_mapping[t])
        if slot >= 0:
            k_pages[slot // page_size, slot % page_size] = kr[t].to(k_pages.dtype)
            v_pages[slot // page_size, slot % page_size] = v[t].to(v_pages.dtype)
    return qr.to(q.dtype)
