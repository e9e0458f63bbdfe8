"""Decode attention over a paged KV cache in plain fp32 torch: one query token per sequence, GQA."""

from __future__ import annotations

import torch


def gather_pages(pages: torch.Tensor, block_table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` cached tokens of one sequence: pages [P, page_size, nkv, d] read through its block
    table row [max_pages] -> [length, nkv, d]."""
    page_size = pages.shape[1]
    n_pages = -(-length // page_size)
    return pages[block_table_row[:n_pages].long()].flatten(0, 1)[:length]


def paged_decode_attention_naive(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                                 block_table: torch.Tensor, context_lens: torch.Tensor,
                                 scale: float | None = None, first_keys: torch.Tensor | None = None,
                                 gate: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, nh, d] (already normed and rotated); context_lens [B] counts the keys to attend to (the current token
    included); first_keys [B] (optional) the first key each row attends to (a sliding window: keys
    first..context-1). Query head h reads KV head h // (nh / nkv). A row with no keys yields zeros. gate [B, nh, d]
    (optional): the output times sigmoid(gate), rounded once. Returns [B, nh, d]."""
    B, nh, d = q.shape
    nkv = k_pages.shape[2]
    scale = d ** -0.5 if scale is None else scale
    out = torch.zeros(B, nh, d, dtype=torch.float32, device=q.device)
    for b in range(B):
        n = int(context_lens[b])
        f = 0 if first_keys is None else int(first_keys[b])
        if n <= f:
            continue
        k = gather_pages(k_pages, block_table[b], n)[f:].float().repeat_interleave(nh // nkv, 1)  # [n - f, nh, d]
        v = gather_pages(v_pages, block_table[b], n)[f:].float().repeat_interleave(nh // nkv, 1)
        probs = torch.softmax(torch.einsum("hd,nhd->hn", q[b].float(), k) * scale, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", probs, v)
    if gate is not None:
        out = out * torch.sigmoid(gate.float())
    return out.to(q.dtype)
