"""Quantized decode GEMV: y [M, N] = x [M, K] @ dequant(w)^T for M <= 16, reading the packed weight once and
dequantizing in registers, plus a tile dequantizer for the prefill path (dequantize-then-GEMM by row chunks).

The GEMV follows ``ninfer.fast.ops.gemv`` (BW weight rows per program, x padded to 16 rows for ``tl.dot``, split-K
with the last-arriving program summing the fp32 partials in a fixed order). Each K tile of the weight is decoded to
small exact values (e4m3, signed int4/int5 codes, or e2m1 times its e4m3 block scale: at most 6 significant bits,
exact in bf16), multiplied against x on the tensor cores in fp32, and scaled per row afterwards: a tile never spans
two fp8 column blocks or two int groups, so ``acc += dot(x, w_tile) * scale[row]`` is the format's math with one
fp32 rounding per tile. NVFP4's fp32 second-level scale (per row here) scales the accumulator at the end.

``PAIRS`` mode serves the routed MoE experts at decode sizes: program axis 2 is a (token, slot) pair, whose expert
id selects the weight stack entry and whose token selects the x row; ``SWIGLU`` interleaves gate row i and up row
half + i in one tile as ``gemv_swiglu`` does; ``HAS_PW`` scales a pair's output by its routing weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.fast.ops.gemv.triton import _finish, _tile_rows

from .fastgemv import fast_kind, fp32_dot, qgemv_fast, split_plan
from .layout import DEQUANT_CHUNK_BYTES, QKind, QuantWeight
from .planes import _blocks, _scaled

MAX_ROWS = 16
_KIND_ID = {QKind.FP8: 0, QKind.INT4: 1, QKind.INT5: 2, QKind.NVFP4: 3, QKind.INT8: 4}


@triton.jit
def _e2m1(c):
    # 4-bit codes (sign bit 3, magnitude index 0..7 into 0, .5, 1, 1.5, 2, 3, 4, 6) -> fp32, built as fp32 bits:
    # index i >= 2 is 2^((i >> 1) - 1) * (1 + (i & 1) / 2), index 1 is 0.5
    i = c & 7
    bits = tl.where(i >= 2, (((i >> 1) + 126) << 23) | ((i & 1) << 22), tl.where(i == 1, 126 << 23, 0))
    bits = bits | ((c >> 3) << 31)
    return bits.to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _codes(d_rows, valid, k0, KB, KIND: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr):
    """The stored codes of columns k0..k0+BK as int32 [BW, BK] (int4/NVFP4 nibbles, int5 bit fields, int8 bytes).
    One return: the compiler builds every branch that follows an early return, whatever the constexpr."""
    if KIND == 2:
        # int5: code e at bits [5e, 5e + 5) of the row's little-endian bit stream
        bit = (k0 + tl.arange(0, BK)) * 5
        byte = bit >> 3
        lo = tl.load(d_rows + byte[None, :], mask=valid[:, None], other=0).to(tl.int32)
        hi = tl.load(d_rows + byte[None, :] + 1, mask=valid[:, None] & (byte + 1 < KB)[None, :], other=0)
        codes = ((lo | (hi.to(tl.int32) << 8)) >> (bit & 7)[None, :]) & 31
    elif KIND == 4:
        codes = tl.load(d_rows + (k0 + tl.arange(0, BK))[None, :], mask=valid[:, None], other=0).to(tl.int32)
    else:
        b = tl.load(d_rows + (k0 // 2 + tl.arange(0, BK // 2))[None, :], mask=valid[:, None], other=0).to(tl.int32)
        codes = tl.reshape(tl.join(b & 15, b >> 4), (BW, BK))  # element 2j is the low nibble of byte j
    return codes


@triton.jit
def _tile(d_ptr, s_ptr, r_ptr, z_ptr, rows, valid, k0, K, KB, BR, BC, stride_d, stride_s, stride_z,
          KIND: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr, SB: tl.constexpr, EVEN_K: tl.constexpr,
          HAS_ZERO: tl.constexpr):
    """Weight rows ``rows`` [BW], columns k0..k0+BK, dequantized to fp32 [BW, BK] in the format's order:
    e4m3 * scale, (u - z) * s, e2m1 * (e4m3 scale * global). SB: the columns one scale entry covers in the tile."""
    d_rows = d_ptr + rows[:, None].to(tl.int64) * stride_d  # [BW, 1]
    if KIND == 0:
        k = k0 + tl.arange(0, BK)
        mask = valid[:, None] if EVEN_K else valid[:, None] & (k < K)[None, :]
        v = tl.load(d_rows + k[None, :], mask=mask, other=0.0).to(tl.float32)
        w = _scaled(v, _blocks(s_ptr, rows // BR, valid, k0, K, BC, stride_s, SB, BK // SB), BW, BK, SB)
    elif KIND == 3:
        g = tl.load(r_ptr + rows.to(tl.int64), mask=valid, other=0.0)
        s = _blocks(s_ptr, rows, valid, k0, K, 16, stride_s, 16, BK // 16) * g[:, None]
        w = _scaled(_e2m1(_codes(d_rows, valid, k0, KB, KIND, BW, BK)), s, BW, BK, 16)
    else:
        codes = _codes(d_rows, valid, k0, KB, KIND, BW, BK).to(tl.float32)
        if HAS_ZERO:
            z = _blocks(z_ptr, rows, valid, k0, K, BC, stride_z, SB, BK // SB)
        else:
            z = tl.full((BW, BK // SB), 8.0 if KIND == 1 else (16.0 if KIND == 2 else 128.0), tl.float32)
        u = tl.reshape(tl.reshape(codes, (BW, BK // SB, SB)) - z[:, :, None], (BW, BK))
        w = _scaled(u, _blocks(s_ptr, rows, valid, k0, K, BC, stride_s, SB, BK // SB), BW, BK, SB)
    return w


@triton.jit
def _qgemv_kernel(x_ptr, d_ptr, s_ptr, r_ptr, z_ptr, y_ptr, part_ptr, arrive_ptr, ids_ptr, pw_ptr, M, R, K, KB,
                  k_per, num_splits, half, BR, BC, stride_x, stride_d, stride_s, stride_z, stride_de, stride_se,
                  stride_re, stride_ze, stride_y, KIND: tl.constexpr, HAS_ZERO: tl.constexpr, BM: tl.constexpr,
                  BW: tl.constexpr, BK: tl.constexpr, SB: tl.constexpr, EVEN_K: tl.constexpr,
                  SPLIT: tl.constexpr, SWIGLU: tl.constexpr, FP32_DOT: tl.constexpr, PAIRS: tl.constexpr,
                  TOPK: tl.constexpr, A_PER_PAIR: tl.constexpr, HAS_PW: tl.constexpr, USE_DOT: tl.constexpr):
    pid = tl.program_id(0)
    rows, valid = _tile_rows(pid, half, R, BW, SWIGLU)
    m = tl.arange(0, BM)
    mask_m = m < M
    if PAIRS:
        p = tl.program_id(2).to(tl.int64)
        e = tl.load(ids_ptr + p).to(tl.int64)
        d_ptr += e * stride_de
        s_ptr += e * stride_se
        r_ptr += e * stride_re
        z_ptr += e * stride_ze
        x_ptr += (p if A_PER_PAIR else p // TOPK) * stride_x
        y_ptr += p * stride_y
    x_rows = x_ptr + m[:, None].to(tl.int64) * stride_x  # [BM, 1]
    k_lo = tl.program_id(1) * k_per
    k_hi = tl.minimum(k_lo + k_per, K)
    kk = tl.arange(0, BK)
    acc = tl.zeros((BM, BW), dtype=tl.float32)
    acc1 = tl.zeros((BW,), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        k = k0 + kk
        w = _tile(d_ptr, s_ptr, r_ptr, z_ptr, rows, valid, k0, K, KB, BR, BC, stride_d, stride_s, stride_z, KIND, BW,
                  BK, SB, EVEN_K, HAS_ZERO)
        if USE_DOT:
            mx = mask_m[:, None] if EVEN_K else mask_m[:, None] & (k < K)[None, :]
            x = tl.load(x_rows + k[None, :], mask=mx, other=0.0)  # [BM, BK]
            if FP32_DOT:
                acc += tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
        else:
            # one row of x: fp32 products summed along K in registers, no MMA operand layout to convert into
            x0 = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)  # [BK]
            acc1 += tl.sum(w * x0[None, :], axis=1)
    if not USE_DOT:
        acc = tl.where(m[:, None] == 0, acc1[None, :], 0.0)
    if HAS_PW:
        acc *= tl.load(pw_ptr + p)
    _finish(acc, y_ptr, part_ptr, arrive_ptr, pid, num_splits, M, R, m, mask_m, rows, valid, stride_y, half, BM, BW,
            SPLIT, SWIGLU, y_ptr, 0, False)  # gemv's epilogue: the split-K reduction and the (SwiGLU) store


@triton.jit
def _dequant_kernel(d_ptr, s_ptr, r_ptr, z_ptr, o_ptr, R, K, KB, BR, BC, stride_d, stride_s, stride_z, stride_o,
                    KIND: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr, SB: tl.constexpr,
                    EVEN_K: tl.constexpr, HAS_ZERO: tl.constexpr):
    rows = tl.program_id(0) * BW + tl.arange(0, BW)
    valid = rows < R
    k0 = tl.program_id(1) * BK
    w = _tile(d_ptr, s_ptr, r_ptr, z_ptr, rows, valid, k0, K, KB, BR, BC, stride_d, stride_s, stride_z, KIND, BW, BK,
              SB, EVEN_K, HAS_ZERO)
    k = k0 + tl.arange(0, BK)
    tl.store(o_ptr + rows[:, None].to(tl.int64) * stride_o + k[None, :], w.to(o_ptr.dtype.element_ty),
             mask=valid[:, None] & (k < K)[None, :])


def tile_k(w: QuantWeight, bw: int) -> tuple[int, int]:
    """(BK, SB): the K tile, about 8192 weight elements a tile so the decoded fp32 tile stays in registers, whole bytes
    of packed codes and (but for fp8's masked tail) dividing K; and the columns one scale entry covers inside it."""
    K, bc = w.k, w.block_cols
    cap = max(16, min(512, 8192 // bw))
    if w.kind == QKind.FP8:
        bk = min(cap, triton.next_power_of_2(K))
        # one column block (per-row scales, or a block as wide as K): one scale entry per tile
        return bk, (bk if bc >= K else min(bc, bk))
    bk = min(cap // 2 if w.kind == QKind.INT5 else cap, K & -K)
    return bk, (16 if w.kind == QKind.NVFP4 else min(bc, bk))


def _strides(w: QuantWeight) -> tuple[int, ...]:
    """(data, scales, zeros) row strides, then their and the row scale's expert strides (0 for a matrix)."""
    d, s, r, z = w.data, w.scales, w.row_scale, w.zeros
    lead = len(w.shape) == 3

    def e(t):
        return t.stride(0) if lead and t is not None else 0
    return d.stride(-2), s.stride(-2), z.stride(-2) if z is not None else 0, e(d), e(s), e(r), e(z)


def _aux(w: QuantWeight) -> tuple[torch.Tensor, torch.Tensor]:
    # kernels take every pointer; an absent plane is any tensor the constexpr flags never read
    return (w.row_scale if w.row_scale is not None else w.scales), (w.zeros if w.zeros is not None else w.scales)


def qgemv(x: torch.Tensor, w: QuantWeight, out: torch.Tensor | None = None, swiglu: bool = False,
          splits: int | None = None, bw: int | None = None, num_warps: int = 4, num_stages: int = 4,
          use_dot: bool | None = None, bk: int | None = None) -> torch.Tensor:
    """x [M, K] (M <= 16, any row stride) @ dequant(w [N, K])^T -> [M, N] in x's dtype, fp32 accumulation; with
    ``swiglu``, w = [gate | up] and the result is silu(gate) * up [M, N/2]. ``splits``, ``bw`` (weight rows per
    program), ``num_warps`` and ``num_stages`` override the shape heuristic (tests, benchmarks/gpu/bench_qgemv.py);
    ``use_dot=False`` sums fp32 products in registers instead of a padded ``tl.dot`` (the generic kernel: M = 1
    only); ``bk``: an FP8 weight's K tile (``fastgemv._config``). Tiled int4 and 2-D FP8 weights run ``fastgemv``'s
    kernels."""
    M, K = x.shape
    R = w.n
    assert len(w.shape) == 2 and w.k == K and 1 <= M <= MAX_ROWS, f"qgemv: x {tuple(x.shape)}, w {w.shape}"
    x = x if x.stride(1) == 1 else x.contiguous()
    n_out = R // 2 if swiglu else R
    y = x.new_empty(M, n_out) if out is None else out
    if fast_kind(w):
        return qgemv_fast(x, w, y, swiglu, splits, bw, num_warps, num_stages, use_dot, bk)
    if use_dot is None:
        # measured (bench_qgemv.py, H100, the six 9B projections, eighth session): NVFP4 at one row sums in
        # registers 1.17-1.35x faster than through a padded tl.dot in every shape; the other kinds were not swept
        use_dot = not (M == 1 and w.kind == QKind.NVFP4)
    assert use_dot or M == 1, "qgemv: the dot-free form takes one row"
    # measured on the H200 (bench_qgemv.py: 9B in_proj and down, int4 and NVFP4): 32 rows a program, 4 warps,
    # 4 stages is the best or within 3% of it at M = 1 (16 rows: 1.7x slower)
    bw = bw or (32 if M <= 8 else 64)
    bk, sb = tile_k(w, bw)
    blocks = triton.cdiv(n_out, bw // 2) if swiglu else triton.cdiv(R, bw)
    k_per, splits, part, arrivals = split_plan(x, y, blocks, M, R, K, bk, splits)
    if w.perm is not None:
        # act-order: W @ x == W_stored @ x[perm]
        x = x.index_select(1, w.perm)
    sd, ss, sz, _, _, _, _ = _strides(w)
    rs, zs = _aux(w)
    _qgemv_kernel[(blocks, splits, 1)](
        x, w.data, w.scales, rs, zs, y, part, arrivals, y, y, M, R, K, w.data.shape[-1], k_per, splits, n_out,
        w.block_rows, w.block_cols, x.stride(0), sd, ss, sz, 0, 0, 0, 0, y.stride(0), KIND=_KIND_ID[w.kind],
        HAS_ZERO=w.zeros is not None, BM=MAX_ROWS,
        BW=bw, BK=bk, SB=sb, EVEN_K=K % bk == 0, SPLIT=splits > 1, SWIGLU=swiglu, FP32_DOT=fp32_dot(x), PAIRS=False,
        TOPK=1, A_PER_PAIR=False, HAS_PW=False, USE_DOT=use_dot, num_warps=num_warps, num_stages=num_stages)
    return y


def qgemv_pairs(x: torch.Tensor, w: QuantWeight, ids: torch.Tensor, top_k: int, a_per_pair: bool,
                pair_weights: torch.Tensor | None = None, swiglu: bool = False,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Per (token, slot) pair p = t * top_k + j: x[t] (or x[p] with ``a_per_pair``) @ dequant(w[ids[p]])^T, times
    ``pair_weights[p]``; w is an [E, N, K] stack. Returns [P, N] (or [P, N/2] with ``swiglu``)."""
    P = ids.numel()
    K = x.shape[1]
    R = w.n
    assert len(w.shape) == 3 and w.k == K, f"qgemv_pairs: x {tuple(x.shape)}, w {w.shape}"
    x = x if x.stride(1) == 1 else x.contiguous()
    n_out = R // 2 if swiglu else R
    y = torch.empty(P, n_out, device=x.device, dtype=out_dtype or x.dtype)
    bw = 32 if swiglu else 16
    bk, sb = tile_k(w, bw)
    blocks = triton.cdiv(n_out, bw // 2) if swiglu else triton.cdiv(R, bw)
    if w.perm is not None:
        # act-order: each pair's activation row gathered in its expert's stored column order
        rows = x if a_per_pair else x.repeat_interleave(top_k, dim=0)  # [P, K]
        x, a_per_pair = rows.gather(1, w.perm.index_select(0, ids.reshape(-1).long()).long()), True
    sd, ss, sz, sde, sse, sre, sze = _strides(w)
    rs, zs = _aux(w)
    pw = pair_weights.reshape(-1) if pair_weights is not None else y
    _qgemv_kernel[(blocks, 1, P)](
        x, w.data, w.scales, rs, zs, y, y, y, ids.reshape(-1), pw, 1, R, K, w.data.shape[-1], K, 1, n_out,
        w.block_rows, w.block_cols, x.stride(0), sd, ss, sz, sde, sse, sre, sze, y.stride(0), KIND=_KIND_ID[w.kind],
        HAS_ZERO=w.zeros is not None, BM=MAX_ROWS, BW=bw, BK=bk, SB=sb, EVEN_K=K % bk == 0, SPLIT=False, SWIGLU=swiglu,
        FP32_DOT=fp32_dot(x),
        PAIRS=True, TOPK=top_k, A_PER_PAIR=a_per_pair, HAS_PW=pair_weights is not None, USE_DOT=True, num_warps=4,
        num_stages=4)
    return y


def dequantize(w: QuantWeight, dtype: torch.dtype, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Rows [start, stop) of a 2-D w as a dense [stop - start, K] tensor in ``dtype``, in stored column order (an
    act-order weight's columns stay permuted: multiply it with ``x[:, perm]``)."""
    stop = w.n if stop is None else stop
    K = w.k
    out = torch.empty(stop - start, K, device=w.device, dtype=dtype)
    bw = 32
    bk, sb = tile_k(w, bw)
    sd, ss, sz, _, _, _, _ = _strides(w)
    assert start % w.block_rows == 0, "dequantize: a row chunk starts on a scale block boundary"
    d, s = w.data[start:stop], w.scales[start // w.block_rows:]
    r = w.row_scale[start:stop] if w.row_scale is not None else s
    z = w.zeros[start:stop] if w.zeros is not None else s
    _dequant_kernel[(triton.cdiv(stop - start, bw), triton.cdiv(K, bk))](
        d, s, r, z, out, stop - start, K, w.data.shape[-1], w.block_rows, w.block_cols, sd, ss, sz, out.stride(0),
        KIND=_KIND_ID[w.kind], BW=bw, BK=bk, SB=sb, EVEN_K=K % bk == 0, HAS_ZERO=w.zeros is not None)
    return out


def qlinear(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """Any row count: the GEMV at M <= 16, else dequantize-then-GEMM (cuBLAS) in row chunks of at most
    ``DEQUANT_CHUNK_BYTES`` of dense weight, so the transient stays bounded."""
    if x.shape[0] <= MAX_ROWS:
        return qgemv(x, w)
    if w.perm is not None:
        x = x.index_select(1, w.perm)
    K = w.k
    step = max(1, DEQUANT_CHUNK_BYTES // (K * x.element_size()))
    if w.block_rows > 1:
        step = max(w.block_rows, step // w.block_rows * w.block_rows)
    if step >= w.n:
        return torch.nn.functional.linear(x, dequantize(w, x.dtype))
    return torch.cat([torch.nn.functional.linear(x, dequantize(w, x.dtype, r, min(r + step, w.n)))
                      for r in range(0, w.n, step)], dim=1)
