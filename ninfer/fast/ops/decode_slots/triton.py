"""A decode step's KV addressing in one launch: the rows' block tables gathered from the pool's and the flat KV slot
of every new token, where torch needs nine small kernels (casts, the gather, the page arithmetic). One program per
row, over the table in blocks."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl


@triton.jit
def _decode_slots_kernel(bt_ptr, row_ptr, pos_ptr, table_ptr, slot_ptr, max_pages, stride_bt, stride_t,
                         PAGE: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    b = tl.program_id(0)
    src = bt_ptr + tl.load(row_ptr + b).to(tl.int64) * stride_bt
    dst = table_ptr + b.to(tl.int64) * stride_t
    for p0 in range(0, max_pages, BLOCK):
        p = p0 + tl.arange(0, BLOCK)
        tl.store(dst + p, tl.load(src + p, mask=p < max_pages), mask=p < max_pages)
    pos = tl.load(pos_ptr + b).to(tl.int64)
    page = tl.load(src + pos // PAGE).to(tl.int64)
    tl.store(slot_ptr + b, page * PAGE + pos % PAGE)


def decode_slots(block_tables: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                 page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``decode_slots_naive``; block_tables [R, max_pages] int32 with contiguous rows."""
    B, max_pages = rows.shape[0], block_tables.shape[1]
    assert block_tables.dtype == torch.int32 and block_tables.stride(1) == 1
    table = torch.empty(B, max_pages, dtype=torch.int32, device=block_tables.device)
    slots = torch.empty(B, dtype=torch.int64, device=block_tables.device)
    on = pdl.active(block_tables)
    _decode_slots_kernel[(B,)](block_tables, rows, positions, table, slots, max_pages, block_tables.stride(0),
                               table.stride(0), PAGE=page_size, BLOCK=min(1024, triton.next_power_of_2(max_pages)),
                               PDL=on, **pdl.launch(on))
    return table, slots
