"""Non-causal attention of the vision tower in plain fp32 torch: packed segments (one per image frame), every query
sees every key of its own segment and none of another's."""

from __future__ import annotations

import torch


def vision_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                           scale: float | None = None) -> torch.Tensor:
    """q, k, v [N, nh, d] (rotated); segment s owns rows cu_seqlens[s]:cu_seqlens[s+1]. Returns [N, nh, d] in q's
    dtype."""
    d = q.shape[-1]
    scale = d ** -0.5 if scale is None else scale
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    bounds = cu_seqlens.tolist()
    for s, e in zip(bounds, bounds[1:]):
        scores = torch.einsum("thd,nhd->htn", q[s:e].float(), k[s:e].float()) * scale  # [nh, t, t]
        out[s:e] = torch.einsum("htn,nhd->thd", torch.softmax(scores, dim=-1), v[s:e].float())
    return out.to(q.dtype)
