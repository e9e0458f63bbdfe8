"""The MTP draft's start in one launch (``draft_start_naive`` says what it writes): program (b, c) copies chunk c of
row b's partial page in both pools into the row's first scratch page, and chunk 0 also writes the row's private
table, its hidden, pending token and position. Before it the draft graph's start was 25 small torch launches (index
arithmetic, gathers, the two pools' index copies)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl


@triton.jit
def _draft_start_kernel(bt_ptr, row_ptr, f_ptr, pend_ptr, slot_ptr, st_ptr, k_ptr, v_ptr, table_ptr, h_ptr, tok_ptr,
                        pos_ptr, max_pages, H, page_elems, num_pages, scratch_pages, stride_bt, stride_st,
                        stride_page, stride_t, stride_h, PAGE: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr = False):
    pdl.enter(PDL)
    b = tl.program_id(0)
    c = tl.program_id(1)
    r = tl.load(row_ptr + b).to(tl.int64)
    f = tl.load(f_ptr + b).to(tl.int64)
    first = f // PAGE
    src = bt_ptr + r * stride_bt
    base = num_pages + 1 + r * scratch_pages
    partial = tl.load(src + first).to(tl.int64)
    e = c * BLOCK + tl.arange(0, BLOCK)
    m = e < page_elems
    tl.store(k_ptr + base * stride_page + e, tl.load(k_ptr + partial * stride_page + e, mask=m), mask=m)
    tl.store(v_ptr + base * stride_page + e, tl.load(v_ptr + partial * stride_page + e, mask=m), mask=m)
    if c == 0:
        j = tl.arange(0, BLOCK)
        for p0 in range(0, max_pages, BLOCK):
            p = p0 + j
            mp = p < max_pages
            ahead = p - first
            scratch = base + tl.minimum(tl.maximum(ahead, 0), scratch_pages - 1)
            pages = tl.where(ahead >= 0, scratch, tl.load(src + p, mask=mp, other=0).to(tl.int64))
            tl.store(table_ptr + b * stride_t + p, pages.to(tl.int32), mask=mp)
        slot = tl.load(slot_ptr + b).to(tl.int64)
        for h0 in range(0, H, BLOCK):
            h = h0 + j
            tl.store(h_ptr + b * stride_h + h, tl.load(st_ptr + slot * stride_st + h, mask=h < H), mask=h < H)
        tl.store(tok_ptr + b, tl.load(pend_ptr + b).to(tl.int64))
        tl.store(pos_ptr + b, f.to(tl.int32))


def draft_start(block_tables: torch.Tensor, rows: torch.Tensor, frontiers: torch.Tensor, pending: torch.Tensor,
                slot_ids: torch.Tensor, stored: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                table: torch.Tensor, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                num_pages: int, scratch_pages: int) -> None:
    """Same contract as ``draft_start_naive``; the pools' pages contiguous, the tables' and hiddens' rows too."""
    B, max_pages, H = rows.shape[0], block_tables.shape[1], stored.shape[1]
    page_elems = k_pool[0].numel()
    assert k_pool.shape == v_pool.shape and k_pool[0].is_contiguous() and v_pool.stride() == k_pool.stride()
    assert block_tables.stride(1) == table.stride(1) == stored.stride(1) == hidden.stride(1) == 1
    assert tokens.dtype == torch.int64 and positions.dtype == table.dtype == torch.int32
    BLOCK = 1024
    on = pdl.active(block_tables)
    _draft_start_kernel[(B, triton.cdiv(page_elems, BLOCK))](
        block_tables, rows, frontiers, pending, slot_ids, stored, k_pool, v_pool, table, hidden, tokens, positions,
        max_pages, H, page_elems, num_pages, scratch_pages, block_tables.stride(0), stored.stride(0),
        k_pool.stride(0), table.stride(0), hidden.stride(0), PAGE=k_pool.shape[1], BLOCK=BLOCK, PDL=on,
        **pdl.launch(on))
