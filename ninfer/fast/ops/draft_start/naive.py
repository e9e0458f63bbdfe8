"""The MTP draft's start, in plain torch: each drafting row's private block table, its frontier's partial page
copied into its first scratch page (both pools of the MTP layer), and the chain seeded (docs/speculative.md, "The
MTP backend (fast)"; `ninfer.fast.draft_graphs`)."""

from __future__ import annotations

import torch


def draft_start_naive(block_tables: torch.Tensor, rows: torch.Tensor, frontiers: torch.Tensor, pending: torch.Tensor,
                      slot_ids: torch.Tensor, stored: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                      table: torch.Tensor, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                      num_pages: int, scratch_pages: int) -> None:
    """In place, for B = rows.shape[0] rows: block_tables [R, max_pages] int32; rows, frontiers, pending, slot_ids
    [B] int32 (each row's table row, frontier F, pending token, state slot); stored [S, H] (each slot's stored
    hidden); k_pool, v_pool [P, page_size, ...] (the MTP layer's pages). Writes table[:B] [max_pages] int32 (row
    rows[b]'s pages before F's page, then scratch pages num_pages + 1 + rows[b] * scratch_pages + i, the last one
    repeated), k_pool / v_pool at each row's first scratch page (a copy of the page holding F), hidden[:B] (the
    row's stored hidden), tokens[:B] (int64 pending) and positions[:B] (F)."""
    B, page_size = rows.shape[0], k_pool.shape[1]
    r, f = rows.long(), frontiers.long()
    src = block_tables.index_select(0, r)  # [B, max_pages]
    first = f // page_size  # the frontier's page index
    base = num_pages + 1 + r * scratch_pages  # each row's first scratch page
    ahead = torch.arange(src.shape[1], device=src.device)[None, :] - first[:, None]  # [B, max_pages]
    scratch = base[:, None] + ahead.clamp(0, scratch_pages - 1)
    table[:B] = torch.where(ahead >= 0, scratch, src.long()).to(torch.int32)
    partial = src.gather(1, first[:, None])[:, 0].long()
    for pool in (k_pool, v_pool):
        pool.index_copy_(0, base, pool.index_select(0, partial))
    hidden[:B] = stored.index_select(0, slot_ids.long())
    tokens[:B] = pending.long()
    positions[:B] = frontiers
