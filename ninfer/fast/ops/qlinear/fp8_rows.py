"""The FP8 decode GEMV at a few rows of x (2 to `MAX_M`), dot-free: the one-row "row" form (`fp8_row`) widened so
each weight tile is read and converted once for every row (``fastgemv``'s "rows" form, opt-in by
``fastgemv.FP8_ROWS``).

Why: at M > 1 the FP8 weights go through tl.dot (x padded to 16 rows), whose e4m3 -> bf16 conversion costs one
quarter-rate F2F per weight (docs/quantization.md); the 9B step at B = 2 took 5.39 ms against 4.51 at one row
(eighteenth session, H100). Here a program walks its K range in 64-column sub-tiles laid out as the row form's (a
thread loads 16 contiguous bytes of one weight row, 4 threads along K), converts the [BW, 64] tile to fp32 once
(half an e4m3 -> f16x2 and one f16 -> f32 a weight), and for each row m of x sums w * x_m along the sub-tile into
that row's [BW] accumulator, scaled by the sub-tile's column block (a 64-column sub-tile never spans two blocks).
Per weight that is one FMA a row. An H100 SM issues 128 FP32 FMAs a clock against its share of HBM, about 14
bytes a clock (3.35 TB/s over 132 SMs at ~1.75 GHz): about 9 instructions a weight byte before the ALUs, not HBM,
set the pace. At M = 4 the form spends about 4 FMAs and 1.5 conversion instructions a weight; past that the padded
tl.dot wins, so `MAX_M` is 4.

Each row's accumulator is its own [BW] tensor (BM is a constexpr, the rows unrolled), so nothing crosses threads
inside the loop but the sub-tile's row sums (two shuffle rounds: 4 threads along K); the [BM, BW] result is built
once for the shared epilogue (`gemv.triton._finish`: split-K by last arrival, fused SwiGLU).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer.fast.ops import pdl
from ninfer.fast.ops.gemv.triton import _finish

from .fp8_row import _program_tile

MAX_M = 4


@triton.jit
def _row_sum(w, x_ptr, row: tl.constexpr, M, stride_x, k, s):
    """[BW]: the sub-tile w [BW, 64] (fp32) times x's row `row` at columns k [64], by the block scale s [BW]."""
    live = (k * 0 + row) < M  # [64]: a padding row of x reads zeros
    x = tl.load(x_ptr + row * stride_x + k, mask=live, other=0.0).to(tl.float32)
    return tl.sum(w * x[None, :], axis=1) * s


@triton.jit
def _fp8_rows_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, arrive_ptr, M, R, K, k_per, num_splits, half, BR, BC,
                     stride_x, stride_w, stride_s, stride_y, BM: tl.constexpr, BW: tl.constexpr,
                     SPLIT: tl.constexpr, SWIGLU: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)  # reads x (and the split-K tables) only once the kernel before it has finished
    pid, rows, valid, w_rows, s_rows, k_lo, k_hi = _program_tile(w_ptr, s_ptr, R, K, k_per, half, BR, stride_w,
                                                                 stride_s, BW, SWIGLU)
    kk = tl.arange(0, 64)
    acc0 = tl.zeros((BW,), dtype=tl.float32)
    acc1 = tl.zeros((BW,), dtype=tl.float32)
    acc2 = tl.zeros((BW,), dtype=tl.float32)
    acc3 = tl.zeros((BW,), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, 64):
        k = k0 + kk
        w = tl.load(w_rows + k[None, :], mask=valid[:, None], other=0.0).to(tl.float32)  # [BW, 64]
        s = tl.load(s_rows + k0 // BC, mask=valid, other=0.0).to(tl.float32)  # [BW]: this sub-tile's block
        acc0 += _row_sum(w, x_ptr, 0, M, stride_x, k, s)
        acc1 += _row_sum(w, x_ptr, 1, M, stride_x, k, s)
        if BM > 2:
            acc2 += _row_sum(w, x_ptr, 2, M, stride_x, k, s)
            acc3 += _row_sum(w, x_ptr, 3, M, stride_x, k, s)
    m = tl.arange(0, BM)
    acc = tl.where(m[:, None] == 0, acc0[None, :], acc1[None, :])  # [BM, BW]
    if BM > 2:
        acc = tl.where(m[:, None] == 2, acc2[None, :], tl.where(m[:, None] == 3, acc3[None, :], acc))
    _finish(acc, y_ptr, part_ptr, arrive_ptr, pid, num_splits, M, R, m, m < M, rows, valid, stride_y, half, BM, BW,
            SPLIT, SWIGLU, y_ptr, 0, False)


def fits(M: int, bk: int | None) -> bool:
    """Whether the rows form runs M rows of a weight the row form fits (`fp8_row.tile` gave `bk`)."""
    return bk is not None and 2 <= M <= MAX_M
