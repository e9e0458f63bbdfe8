"""Triton helpers over a quantized weight's scale and zero-point planes, shared by the generic decode GEMV
(`triton.py`) and the FP8 tile kernel (`fp8_gemv.py`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _blocks(ptr, rows, valid, k0, K, BC, stride, SB: tl.constexpr, NSB: tl.constexpr):
    """Per row, the plane entries of the NSB column blocks of SB columns from k0 (entry (k0 + j*SB) // BC): [BW, NSB]
    fp32. SB divides BC, or BC >= K (one entry per row)."""
    start = k0 + tl.arange(0, NSB) * SB
    mask = valid[:, None] & (start < K)[None, :]
    # no `other`: one call serves fp32, fp16/bf16, e4m3 and uint8 planes
    v = tl.load(ptr + rows[:, None].to(tl.int64) * stride + (start // BC)[None, :], mask=mask)
    return tl.where(mask, v.to(tl.float32), 0.0)


@triton.jit
def _scaled(v, s, BW: tl.constexpr, BK: tl.constexpr, SB: tl.constexpr):
    """v [BW, BK] times s [BW, BK/SB], each entry of s over its SB columns."""
    return tl.reshape(tl.reshape(v, (BW, BK // SB, SB)) * s[:, :, None], (BW, BK))
