"""The vision tower's 2D rotary on q and k of the qkv projection, in place: one program per block of rows and per
q or k, all heads at once (a [rows, heads * d/2] tile of first halves and the matching second halves), fp32 math.
It replaces eight elementwise passes over fp32 copies of q and k with one read and one write of each."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, N, L, stride_n, stride_t, stride_h, HALF: tl.constexpr,
                   COLS: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    which = tl.program_id(1)  # 0: q, 1: k
    cols = tl.arange(0, BC)  # head * HALF + j
    head, j = cols // HALF, cols % HALF
    mask = (rows < N)[:, None] & (cols < COLS)[None, :]
    base = x_ptr + rows.to(tl.int64)[:, None] * stride_n + which * stride_t + (head * stride_h + j)[None, :]
    a = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(base + HALF, mask=mask, other=0.0).to(tl.float32)
    t = (rows % L).to(tl.int64)[:, None] * HALF + j[None, :]
    c = tl.load(cos_ptr + t, mask=mask, other=0.0)
    s = tl.load(sin_ptr + t, mask=mask, other=0.0)
    tl.store(base, (a * c - b * s).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(base + HALF, (b * c + a * s).to(x_ptr.dtype.element_ty), mask=mask)


def vision_rotary(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Same contract as ``vision_rotary_naive``; qkv's head dim is contiguous, cos/sin contiguous fp32."""
    N, three, nh, d = qkv.shape
    assert three == 3 and qkv.stride(3) == 1 and d % 2 == 0 and cos.shape == sin.shape == (cos.shape[0], d // 2)
    cols = nh * d // 2
    BC = triton.next_power_of_2(cols)
    BR = max(1, 4096 // BC)  # about 4K elements of each half per program
    grid = (triton.cdiv(N, BR), 2)
    _rotary_kernel[grid](qkv, cos, sin, N, cos.shape[0], qkv.stride(0), qkv.stride(1), qkv.stride(2),
                         HALF=d // 2, COLS=cols, BR=BR, BC=BC, num_warps=4)
