"""FP8 block-scaled GEMM for prefill where every Use of the weight allows 8-bit activations (AllowA8):
y [M, N] = (xq * xs) @ (wq * ws)^T on the FP8 tensor cores.

``quantize_rows_fp8`` quantizes x per token and per ``bc``-column block (the weight's column block): scale =
amax / 448, e4m3 codes. The GEMM walks K one block at a time, so each ``tl.dot`` of e4m3 tiles is scaled by the
token's activation scale and the weight block's scale in fp32: ``acc += dot(xq, wq^T) * xs[:, None] * ws[None, :]``,
the format's math (DeepSeek-V3's recipe, 1x128 activations x 128x128 weights).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ninfer.fast.ops.qlinear.layout import QuantWeight, a8_block

from . import cublas

E4M3_MAX = 448.0
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# (BM, BN, warps, stages); the first is the interpreter's fixed choice. Few, because each (N, K) autotunes at the
# serve warm-up's prefill (and the choice then serves every prefill length)
_TILES = ((32, 32, 4, 1), (128, 128, 8, 3), (128, 128, 4, 4), (128, 256, 8, 3))


@triton.jit
def _quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, nb, BC: tl.constexpr, NB: tl.constexpr):
    # one program per (row, NB blocks of BC columns): [NB, BC] tiles, amax per block
    m = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1) * NB + tl.arange(0, NB)
    k = b[:, None] * BC + tl.arange(0, BC)[None, :]  # [NB, BC]
    x = tl.load(x_ptr + m * stride_x + k, mask=k < K, other=0.0).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-12) / 448.0  # [NB]
    q = tl.minimum(tl.maximum(x / s[:, None], -448.0), 448.0)
    # round to e4m3's 3 mantissa bits (nearest, ties to even) in fp32 first, so the cast is exact: the Triton
    # interpreter's own fp8 cast drops the carry into the exponent (126.8 -> 64)
    bits = q.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000
    q = bits.to(tl.float32, bitcast=True)
    tl.store(q_ptr + m * stride_q + k, q.to(q_ptr.dtype.element_ty), mask=k < K)
    tl.store(s_ptr + m * nb + b, s, mask=b < nb)


def quantize_rows_fp8(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], fp32 scales [M, ceil(K/block)]), each block's amax mapped onto 448."""
    M, K = x.shape
    nb = triton.cdiv(K, block)
    per = min(triton.next_power_of_2(nb), max(1, 4096 // block))  # blocks per program: about 4096 elements
    q = torch.empty(M, K, device=x.device, dtype=torch.float8_e4m3fn)
    s = torch.empty(M, nb, device=x.device, dtype=torch.float32)
    _quant_kernel[(M, triton.cdiv(nb, per))](x, q, s, K, x.stride(0), q.stride(0), nb, BC=block, NB=per)
    return q, s


@triton.jit
def _gemm_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, o_ptr, M, N, K, BR, BC, nb_a, stride_a, stride_w, stride_ws,
                 stride_o, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FP32_DOT: tl.constexpr,
                 GROUP: tl.constexpr):
    # programs walk GROUP row tiles down one column of weight tiles before moving on, so each weight tile is read
    # from HBM once and from L2 by the rest of its group
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    first = (pid // (GROUP * grid_n)) * GROUP
    rows = tl.minimum(grid_m - first, GROUP)
    pid_m = first + (pid % (GROUP * grid_n)) % rows
    pid_n = (pid % (GROUP * grid_n)) // rows
    m = pid_m * BM + tl.arange(0, BM)
    n = pid_n * BN + tl.arange(0, BN)
    mm, mn = m < M, n < N
    kk = tl.arange(0, BK)
    a_rows = a_ptr + m[:, None].to(tl.int64) * stride_a
    w_rows = w_ptr + n[:, None].to(tl.int64) * stride_w
    ws_rows = ws_ptr + (n // BR).to(tl.int64) * stride_ws
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + kk
        mk = k < K
        a = tl.load(a_rows + k[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
        w = tl.load(w_rows + k[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
        sa = tl.load(as_ptr + m.to(tl.int64) * nb_a + k0 // BK, mask=mm, other=0.0)  # [BM]
        sw = tl.load(ws_rows + k0 // BC, mask=mn, other=0.0)  # [BN]
        if FP32_DOT:
            part = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            part = tl.dot(a, tl.trans(w))
        acc += part * sa[:, None] * sw[None, :]
    tl.store(o_ptr + m[:, None].to(tl.int64) * stride_o + n[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=mm[:, None] & mn[None, :])


if _INTERPRET:
    _gemm = _gemm_kernel
else:
    _gemm = triton.autotune([triton.Config({"BM": bm, "BN": bn}, num_warps=w, num_stages=st)
                             for bm, bn, w, st in _TILES[1:]], key=["N", "K"])(_gemm_kernel)


def fp8_gemm(x: torch.Tensor, w: QuantWeight, use_cublas: bool = True) -> torch.Tensor:
    """x [M, K] (bf16/fp16/fp32) -> [M, N] in x's dtype, on the FP8 tensor cores; w an FP8 QuantWeight with an
    ``a8_block``. Through cuBLAS's blockwise FP8 where it qualifies (`cublas.py`; `use_cublas=False`: this
    kernel always)."""
    M, K = x.shape
    bk = a8_block(w)
    assert bk is not None and w.k == K, f"fp8_gemm: x {tuple(x.shape)}, w {w.kind} {w.shape} block {w.block_cols}"
    xq, xs = quantize_rows_fp8(x, bk)
    if use_cublas and cublas.eligible(x, w):  # cuBLAS's blockwise FP8 where it takes the shape (faster)
        out = cublas.blockwise_fp8(xq, xs, w)
        if out is not None:
            return out
    N = w.n
    out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    bc = w.block_cols if w.block_cols < K else triton.cdiv(K, bk) * bk
    fixed = dict(BM=_TILES[0][0], BN=_TILES[0][1]) if _INTERPRET else {}
    grid = (triton.cdiv(M, fixed["BM"]) * triton.cdiv(N, fixed["BN"]),) if _INTERPRET else \
        (lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),))
    _gemm[grid](xq, xs, w.data, w.scales, out, M, N, K, w.block_rows, bc, xs.shape[1], xq.stride(0),
                w.data.stride(0), w.scales.stride(0), out.stride(0), BK=bk, FP32_DOT=_INTERPRET, GROUP=8, **fixed)
    return out
