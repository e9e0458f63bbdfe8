"""The decode GEMV's one-row pieces: the norm prologue's 1 / rms of x's rows, and the dot-free sum of one row of x
against a program's weight rows (the "fma" form, opt-in by ``triton.ONE_ROW``).

Why a dot-free form: at one row the tl.dot form pads x to 16 rows and stages every weight tile through shared
memory for the tensor cores (cp.async, then wgmma reading it back), so each tile waits on that round trip; FP8's
one-row form without it ran each 9B projection 10-20% faster (docs/quantization.md, "row" form). Here a program
loads its [BW, BK] tile straight into registers (16 contiguous bytes a thread), multiplies it by x's [BK] slice of
the same layout and accumulates [BW, BK] fp32 partials, summed along K once at the end: one FMA a weight, nothing
crossing threads inside the loop. bf16 x bf16 products are exact in fp32, as the tensor cores' are, so the two
forms differ only in the order of the fp32 sums.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _row_rstd(x_rows, mask_m, K, eps, BM: tl.constexpr, BK: tl.constexpr):
    """1 / rms of each x row over all of K (fp32 [BM]): the norm prologue, the same in every program and split."""
    kk = tl.arange(0, BK)
    ss = tl.zeros((BM,), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + kk
        x = tl.load(x_rows + k[None, :], mask=mask_m[:, None] & (k < K)[None, :], other=0.0).to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _fma_row(x_ptr, w_ptr, nw_ptr, stride_w, rows, valid, k_lo, k_hi, K, eps, BW: tl.constexpr, BK: tl.constexpr,
             EVEN_K: tl.constexpr, NORM: tl.constexpr):
    """x[0, k_lo:k_hi] @ w[rows, k_lo:k_hi]^T -> [1, BW] fp32 without tl.dot; with NORM (1: the prologue's rstd over
    all of K, 2: x^2 summed in the loop, when k_lo..k_hi is all of K) x is rmsnorm(x) * (1 + nw), rounded as
    ``_dot_rows`` rounds it."""
    kk = tl.arange(0, BK)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w  # [BW, 1]
    acc = tl.zeros((BW, BK), dtype=tl.float32)
    ss = tl.zeros((BK,), dtype=tl.float32)
    if NORM == 1:
        one = tl.arange(0, 1)
        rstd = _row_rstd(x_ptr + one[:, None].to(tl.int64), one < 1, K, eps, 1, BK)  # [1]
    for k0 in range(k_lo, k_hi, BK):
        k = k0 + kk
        if EVEN_K:  # a K mask would break the loads' vectorisation
            x = tl.load(x_ptr + k)  # [BK], a slice of w's layout
            w = tl.load(w_rows + k[None, :], mask=valid[:, None], other=0.0)  # [BW, BK]
            if NORM:
                nw = tl.load(nw_ptr + k).to(tl.float32)
        else:
            mk = k < k_hi
            x = tl.load(x_ptr + k, mask=mk, other=0.0)
            w = tl.load(w_rows + k[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
            if NORM:
                nw = tl.load(nw_ptr + k, mask=mk, other=0.0).to(tl.float32)
        if NORM == 1:
            x = (x.to(tl.float32) * rstd * (1.0 + nw)).to(x.dtype)
        elif NORM == 2:
            xf = x.to(tl.float32)
            ss += xf * xf
            x = (xf * (1.0 + nw)).to(x.dtype)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    out = tl.sum(acc, axis=1)  # [BW]
    if NORM == 2:
        out *= 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
    return out[None, :]
