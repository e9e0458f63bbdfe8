"""The FP8 decode GEMV at one row of x, dot-free and free of layout conversions (``fastgemv``'s one-row "row" form).

Why a kernel of its own (sm_90 SASS of the other two forms, docs/quantization.md): the tl.dot form converts each
e4m3 weight to bf16 with a native e4m3 -> f16x2 conversion and then one F2F per weight, which issues at a quarter of
the ALU rate (16 a clock per SM), reads the staged tile back from shared memory 2 bytes at a time and waits for its
wgmma every tile; the earlier dot-free form moved its 512-wide tile and the scale blocks between layouts through
shared memory with ~10 barriers per tile. Here each program walks its K range in sub-tiles of 64 columns: a thread
loads 16 contiguous bytes of one weight row (threads 4 along K, 8 rows a warp), and x's [64] vector is a slice of
that layout, so nothing crosses threads inside the loop. Per weight: half an e4m3 -> f16x2 conversion, one
f16 -> f32 (HADD2.F32, full rate) and one FMA, plus half an FMA to apply the column block's scale to the [BW, 64]
partial of BK columns (BK = 128 with 128-column blocks: one scale per row per iteration).

Requires K and the column blocks in multiples of 64 (`tile` says which K tile, or None); otherwise ``fastgemv`` keeps
its other forms.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer.fast.ops import pdl
from ninfer.fast.ops.gemv.triton import _finish, _tile_rows

from .layout import QKind, QuantWeight

SUB = 64  # columns a sub-tile: 16 bytes a thread, 4 threads along K
ROWS = 64  # weight rows a program (sm_90 build: 93 registers at 4 warps, 5 programs an SM)


def tile(w: QuantWeight) -> int | None:
    """The K tile BK (columns a scale lookup covers) for w, or None where this kernel does not apply."""
    if w.kind != QKind.FP8 or len(w.shape) != 2 or w.tiled or w.k % SUB:
        return None
    whole = w.block_cols >= w.k  # one scale entry per row block
    for bk in (128, SUB):
        if w.k % bk == 0 and (whole or w.block_cols % bk == 0):
            return bk
    return None


@triton.jit
def _program_tile(w_ptr, s_ptr, R, K, k_per, half, BR, stride_w, stride_s, BW: tl.constexpr, SWIGLU: tl.constexpr):
    """This program's weight rows (and which exist), their row and scale pointers [BW, 1] / [BW], and its K range
    (the row forms' shared prologue)."""
    pid = tl.program_id(0)
    rows, valid = _tile_rows(pid, half, R, BW, SWIGLU)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w  # [BW, 1]
    s_rows = s_ptr + (rows // BR).to(tl.int64) * stride_s  # [BW]
    k_lo = tl.program_id(1) * k_per
    return pid, rows, valid, w_rows, s_rows, k_lo, tl.minimum(k_lo + k_per, K)


@triton.jit
def _fp8_row_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, arrive_ptr, R, K, k_per, num_splits, half, BR, BC,
                    stride_w, stride_s, stride_y, BW: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                    SWIGLU: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)  # reads x (and the split-K tables) only once the kernel before it has finished
    pid, rows, valid, w_rows, s_rows, k_lo, k_hi = _program_tile(w_ptr, s_ptr, R, K, k_per, half, BR, stride_w,
                                                                 stride_s, BW, SWIGLU)
    kk = tl.arange(0, 64)
    acc = tl.zeros((BW, 64), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        part = tl.zeros((BW, 64), dtype=tl.float32)
        for i in tl.static_range(BK // 64):
            k = k0 + i * 64 + kk
            w = tl.load(w_rows + k[None, :], mask=valid[:, None], other=0.0)  # [BW, 64] e4m3
            x = tl.load(x_ptr + k).to(tl.float32)  # [64], a slice of w's layout
            part += w.to(tl.float32) * x[None, :]
        s = tl.load(s_rows + k0 // BC, mask=valid, other=0.0).to(tl.float32)  # [BW]: this tile's column block
        acc += part * s[:, None]
    m = tl.arange(0, 1)
    _finish(tl.sum(acc, axis=1)[None, :], y_ptr, part_ptr, arrive_ptr, pid, num_splits, 1, R, m, m < 1, rows, valid,
            stride_y, half, 1, BW, SPLIT, SWIGLU, y_ptr, 0, False)
