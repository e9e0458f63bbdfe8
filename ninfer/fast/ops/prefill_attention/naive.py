"""Causal attention of prefill chunks over the paged cache in plain fp32 torch, for a batch of sequences packed
along T (varlen): each chunk's queries see the sequence's cached prefix and the chunk itself, causally."""

from __future__ import annotations

import torch


def prefill_attention_naive(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                            cu_seqlens: torch.Tensor, prefix_lens: torch.Tensor,
                            scale: float | None = None) -> torch.Tensor:
    """q [T_total, nh, d] (rotated); sequence b owns rows cu_seqlens[b]:cu_seqlens[b+1], its queries sit at cache
    positions prefix_lens[b] + i, and its keys (prefix and chunk, already written) are read through block_table[b].
    Query head h reads KV head h // (nh / nkv). Returns [T_total, nh, d] in q's dtype."""
    _, nh, d = q.shape
    page_size, nkv = k_pages.shape[1], k_pages.shape[2]
    scale = d ** -0.5 if scale is None else scale
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(len(prefix_lens)):
        s, e = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        prefix = int(prefix_lens[b])
        n = prefix + e - s
        pages = block_table[b, :-(-n // page_size)].long()
        k = k_pages[pages].flatten(0, 1)[:n].float().repeat_interleave(nh // nkv, 1)  # [n, nh, d]
        v = v_pages[pages].flatten(0, 1)[:n].float().repeat_interleave(nh // nkv, 1)
        scores = torch.einsum("thd,nhd->htn", q[s:e].float(), k) * scale  # [nh, t, n]
        q_pos = prefix + torch.arange(e - s, device=q.device)
        scores = scores.masked_fill(torch.arange(n, device=q.device)[None, :] > q_pos[:, None], float("-inf"))
        out[s:e] = torch.einsum("htn,nhd->thd", torch.softmax(scores, dim=-1), v)
    return out.to(q.dtype)
