"""A decode step's KV addressing, in plain torch: each row's block table and the flat KV slot of its new token."""

from __future__ import annotations

import torch


def decode_slots_naive(block_tables: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                       page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """block_tables [R, max_pages] int32 (the pool's rows), rows [B] and positions [B] int on its device ->
    (table [B, max_pages] int32: row rows[b] of block_tables, slot_mapping [B] int64: page * page_size + offset of
    position b in its row's pages)."""
    table = block_tables.index_select(0, rows.long())
    pos = positions.long()
    pages = table.gather(1, (pos // page_size)[:, None])[:, 0].long()
    return table, pages * page_size + pos % page_size
