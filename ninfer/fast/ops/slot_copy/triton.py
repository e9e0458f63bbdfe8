"""Slot copies in one launch per pool, with the slot ids read on the device: the backup copy runs inside the
decode graph, so the host launches nothing for it and each byte is read once and written once (a gather then a
scatter through a temporary would move it twice)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _slot_copy_kernel(pool_ptr, src_ptr, dst_ptr, dst_offset, E, stride_l, stride_s, BLOCK: tl.constexpr):
    layer = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    offs = tl.program_id(2).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < E
    s = tl.load(src_ptr + b).to(tl.int64)
    d = tl.load(dst_ptr + b).to(tl.int64) + dst_offset
    x = tl.load(pool_ptr + layer * stride_l + s * stride_s + offs, mask=mask)
    tl.store(pool_ptr + layer * stride_l + d * stride_s + offs, x, mask=mask)


def slot_copy(pool: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, dst_offset: int = 0) -> None:
    """Same contract as ``slot_copy_naive``; every slot pool[l, s] must be contiguous."""
    L, S = pool.shape[:2]
    if L == 0:  # a pipeline stage without GDN layers holds an empty (0, S, ...) pool: nothing to copy
        return
    E = pool[0, 0].numel()
    assert pool[0, 0].is_contiguous() and pool.stride(1) == E, "each slot must be one contiguous run"
    B = src.shape[0]
    BLOCK = min(4096, triton.next_power_of_2(E))
    _slot_copy_kernel[(L, B, triton.cdiv(E, BLOCK))](pool, src, dst, dst_offset, E, pool.stride(0), pool.stride(1),
                                                      BLOCK=BLOCK)
