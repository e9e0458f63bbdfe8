"""The FP8 decode GEMV kernel over 2-D e4m3 weights in their stored layout (`fastgemv.qgemv_fast` launches it): a K
tile never spans two column blocks (or, dot-free at one row, a wide tile scales each block's products apart), so
the block scale multiplies the tile's partial sum per row. Rows of x through ``tl.dot`` (x padded to 16 rows; the
e4m3 tile converted to bf16, or with ``F16_DOT`` to f16 with x scaled per row into f16's range by `_f16_scales`,
docs/quantization.md) or dot-free (fp32 FMAs in registers). The epilogue is the dense GEMV's (split-K by last
arrival, fused SwiGLU)."""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer.fast.ops.gemv.triton import _finish, _tile_rows

from .planes import _blocks, _scaled


@triton.jit
def _fp8_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, arrive_ptr, M, R, K, k_per, num_splits, half, BR, BC,
                stride_x, stride_w, stride_s, stride_y, BM: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr,
                SB: tl.constexpr, EVEN_K: tl.constexpr, SPLIT: tl.constexpr, SWIGLU: tl.constexpr,
                USE_DOT: tl.constexpr, FP32_DOT: tl.constexpr, F16_DOT: tl.constexpr):
    pid = tl.program_id(0)
    rows, valid = _tile_rows(pid, half, R, BW, SWIGLU)
    m = tl.arange(0, BM)
    mask_m = m < M
    x_rows = x_ptr + m[:, None].to(tl.int64) * stride_x
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w
    s_rows = s_ptr + (rows // BR).to(tl.int64) * stride_s  # [BW]
    k_lo = tl.program_id(1) * k_per
    k_hi = tl.minimum(k_lo + k_per, K)
    kk = tl.arange(0, BK)
    if F16_DOT:
        up, down = _f16_scales(x_rows, mask_m, k_lo, k_hi, K, BM, BK)  # [BM] each
    if USE_DOT:
        acc = tl.zeros((BW, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BW, BK), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        k = k0 + kk
        if EVEN_K:
            w = tl.load(w_rows + k[None, :], mask=valid[:, None], other=0.0)  # [BW, BK] e4m3
            x = tl.load(x_rows + k[None, :], mask=mask_m[:, None], other=0.0)  # [BM, BK]
        else:
            w = tl.load(w_rows + k[None, :], mask=valid[:, None] & (k < K)[None, :], other=0.0)
            x = tl.load(x_rows + k[None, :], mask=mask_m[:, None] & (k < K)[None, :], other=0.0)
        if SB < BK:
            # a wide tile (dot-free, one row of x): each row's scales of the tile's BK // SB column blocks
            sb = _blocks(s_ptr, rows // BR, valid, k0, K, BC, stride_s, SB, BK // SB)  # [BW, BK // SB]
            xv = tl.sum(x.to(tl.float32), axis=0)  # [BK]: the one row
            acc += (_scaled(w.to(tl.float32), sb, BW, BK, SB) * xv[None, :])[None, :, :]
        else:
            s = tl.load(s_rows + k0 // BC, mask=valid, other=0.0).to(tl.float32)  # the tile's column block
            if USE_DOT:
                if F16_DOT:
                    # e4m3 -> f16 is one native conversion for two weights (bf16 costs one more, quarter-rate, per
                    # weight); x scaled by a power of two per row into f16's range, undone after the loop
                    xs = (x.to(tl.float32) * up[:, None]).to(tl.float16)
                    part = tl.dot(w.to(tl.float16), tl.trans(xs))
                elif FP32_DOT:
                    part = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), input_precision="ieee")
                else:
                    part = tl.dot(w.to(tl.bfloat16), tl.trans(x.to(tl.bfloat16)))
                acc += part * s[:, None]
            elif BM == 1:
                # one row of x as a vector: a slice of the weight tile's layout, no 3-D broadcast to convert into
                acc += (w.to(tl.float32) * s[:, None] * tl.sum(x.to(tl.float32), axis=0)[None, :])[None, :, :]
            else:
                acc += (w.to(tl.float32) * s[:, None])[None, :, :] * x.to(tl.float32)[:, None, :]
    if F16_DOT:
        acc = acc * down[None, :]
    if USE_DOT:
        out = tl.trans(acc)
    else:
        out = tl.sum(acc, axis=2)
    _finish(out, y_ptr, part_ptr, arrive_ptr, pid, num_splits, M, R, m, mask_m, rows, valid, stride_y, half, BM, BW,
            SPLIT, SWIGLU, y_ptr, 0, False)


@triton.jit
def _f16_scales(x_rows, mask_m, k_lo, k_hi, K, BM: tl.constexpr, BK: tl.constexpr):
    """Per row of x over this program's columns: (2^s, 2^-s) [BM] fp32 with max|x| * 2^s in [2^14, 2^15), so the
    scaled row fits f16 (max 65504) with its 11 significant bits, exactly (a power of two; s clamped to +-100)."""
    kk = tl.arange(0, BK)
    amax = tl.zeros((BM,), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        k = k0 + kk
        x = tl.load(x_rows + k[None, :], mask=mask_m[:, None] & (k < K)[None, :], other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # amax in [2^e, 2^(e + 1))
    s = tl.minimum(tl.maximum(14 - e, -100), 100)
    return ((s + 127) << 23).to(tl.float32, bitcast=True), ((127 - s) << 23).to(tl.float32, bitcast=True)
