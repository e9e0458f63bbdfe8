"""Decode GEMV: y [M, N] = x [M, K] @ w [N, K]^T for M <= 16 rows, built to stream w at HBM bandwidth.

At decode sizes the GEMM is a pure weight read, and cuBLAS's small-M kernels leave bandwidth on the table (few,
fat programs and a separate split-K reduce kernel). Here a program owns BW weight rows and streams them once in
BK-wide tiles, software-pipelined over ``num_stages``, against the M rows of x padded to 16 for ``tl.dot`` (padding
rows are masked loads that fetch nothing; the tensor cores have ample slack at 16 columns). BW is small (16 to 64)
so that even N = 1024 gives dozens of programs; when the row blocks are still too few to keep every SM loading,
K is split across programs and the last program of a row block to finish sums the fp32 partials in a fixed order
(deterministic) and writes the output, so split-K costs no second launch. Arrivals are counted in a per-device
int32 table that the last program resets to zero, so it stays clean between calls and CUDA-graph replays.

``gemv_swiglu`` reads a fused [gate | up] weight with gate row i and up row I + i interleaved in one tile, and its
epilogue writes silu(gate) * up, so the [M, 2I] projection never reaches memory.

Two decode-layer fusions save a launch each (docs/ops.md, "gemv"): ``norm_weight`` fuses the zero-centred RMSNorm
of x. A program that streams all of K sums x^2 along the way, feeds x * (1 + w) to the dot and scales its sums by
each row's rstd at the end (no extra pass, no latency before the weight stream); under split-K a program sees only
part of K, so every program first sums x^2 over the whole row (a few KB read from L2) and feeds
x * rstd * (1 + w), rounded to x's dtype as the rmsnorm op's output is. ``residual`` adds the
residual stream in the epilogue (the projection rounded to the io dtype first, as the unfused add saw it), in place
when ``out`` is the residual: each output element is read and written by the one program that owns it.

NOTE: the arrival table is allocated on the first split-K call on a device, which must not be inside a CUDA-graph
capture (the graph runner's warm-up comes first), and calls on one device must not overlap on two streams.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl

from .row import _fma_row, _row_rstd

# tl.dot's smallest tile edge: x is padded to this many rows
MAX_ROWS = 16
_MAX_SPLITS = 8
# split-K only runs with fewer row blocks than 2 * SMs, far below this
_ARRIVAL_SLOTS = 1024
_arrivals: dict[torch.device, torch.Tensor] = {}
# the fused norm's forms, the values _dot_rows's NORM compares against
_NORM_NONE, _NORM_PROLOGUE, _NORM_IN_LOOP = 0, 1, 2
# the form at one row of x: "dot" (x padded to 16 rows through tl.dot) or "fma" (`row._fma_row`: the weight tile
# straight into registers, one FMA a weight; opt-in until a GPU run says, bench_gemv.py "fma"; nineteenth session)
ONE_ROW = "dot"


@dataclass(frozen=True)
class GemvConfig:
    rows: int  # weight rows per program (power of 2, >= 16); gemv_swiglu writes rows // 2 outputs per program
    bk: int  # K tile (power of 2, >= 16)
    splits: int = 1  # programs along K (at most this many; fewer when K is short)
    num_warps: int = 4
    num_stages: int = 4


def pick_config(M: int, rows: int, K: int, elem_bytes: int, num_sms: int, bw: int | None = None,
                fma: bool = False) -> GemvConfig:
    """From shapes only, so a captured graph stays valid. Every K tile of x is re-read from L2 by each program, M/BW
    of the weight traffic: BW (unless given) grows with M to keep that near a quarter. Then K is split until there
    are about two programs per SM, so that every SM has loads in flight. The one-row "fma" form (`fma`) takes the
    FP8 row form's tile: 64 rows by 64 columns, [64, 64] fp32 partials (32 registers a thread at 4 warps)."""
    if fma:
        bw, bk = bw or 64, min(64, max(16, triton.next_power_of_2(K)))
    else:
        bw = bw or max(16, min(64, triton.next_power_of_2(4 * M)))
        # a 64-row tile keeps three pipeline stages within a third of the shared memory
        bk = min(256 if elem_bytes <= 2 and bw < 64 else 128, max(16, triton.next_power_of_2(K)))
    splits = min(triton.cdiv(2 * num_sms, triton.cdiv(rows, bw)), triton.cdiv(K, bk), _MAX_SPLITS)
    return GemvConfig(bw, bk, max(1, splits))


@triton.jit
def _dot_rows(x_ptr, w_ptr, nw_ptr, stride_x, stride_w, m, mask_m, rows, valid, k_lo, k_hi, K, eps,
              BM: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, FP32_DOT: tl.constexpr,
              NORM: tl.constexpr):
    """x[m, k_lo:k_hi] @ w[rows, k_lo:k_hi]^T -> [BM, BW] fp32; with NORM (``_NORM_PROLOGUE`` or, when k_lo..k_hi
    is all of K, ``_NORM_IN_LOOP``) x is rmsnorm(x) * (1 + nw)."""
    kk = tl.arange(0, BK)
    x_rows = x_ptr + m[:, None].to(tl.int64) * stride_x  # [BM, 1]
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w  # [BW, 1]
    acc = tl.zeros((BM, BW), dtype=tl.float32)
    ss = tl.zeros((BM,), dtype=tl.float32)
    if NORM == 1:
        rstd = _row_rstd(x_rows, mask_m, K, eps, BM, BK)
    for k0 in range(k_lo, k_hi, BK):
        k = k0 + kk
        # a K mask would break the loads' vectorisation: full tiles (every real model width) go without one
        if EVEN_K:
            x = tl.load(x_rows + k[None, :], mask=mask_m[:, None], other=0.0)  # [BM, BK]
            w = tl.load(w_rows + k[None, :], mask=valid[:, None], other=0.0)  # [BW, BK]
            if NORM:
                nw = tl.load(nw_ptr + k).to(tl.float32)
        else:
            mk = k < k_hi
            x = tl.load(x_rows + k[None, :], mask=mask_m[:, None] & mk[None, :], other=0.0)
            w = tl.load(w_rows + k[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
            if NORM:
                nw = tl.load(nw_ptr + k, mask=mk, other=0.0).to(tl.float32)
        if NORM == 1:
            # the rmsnorm op's arithmetic and its one rounding to the io dtype: the same operand it would store
            x = (x.to(tl.float32) * rstd[:, None] * (1.0 + nw[None, :])).to(x.dtype)
        elif NORM == 2:
            # the row's scale is a factor of every sum: applied once at the end
            xf = x.to(tl.float32)
            ss += tl.sum(xf * xf, axis=1)
            x = (xf * (1.0 + nw[None, :])).to(x.dtype)
        if FP32_DOT:
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            # bf16 x bf16 products are exact in fp32 and the tensor cores accumulate in fp32
            acc += tl.dot(x.to(w.dtype), tl.trans(w))
    if NORM == 2:
        acc *= (1.0 / tl.sqrt(ss / K + eps))[:, None]
    return acc


@triton.jit
def _store(y_ptr, r_ptr, acc, m, mask_m, rows, valid, stride_y, stride_r, half, BM: tl.constexpr, BW: tl.constexpr,
           SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr):
    y_rows = y_ptr + m[:, None].to(tl.int64) * stride_y  # [BM, 1]
    if RESIDUAL:
        # the projection rounded to the stream's dtype, then the add rounded again: what the unfused add computes
        mask = mask_m[:, None] & valid[None, :]
        r = tl.load(r_ptr + m[:, None].to(tl.int64) * stride_r + rows[None, :], mask=mask, other=0.0)
        out = acc.to(r.dtype).to(tl.float32) + r.to(tl.float32)
        tl.store(y_rows + rows[None, :], out.to(y_ptr.dtype.element_ty), mask=mask)
    elif SWIGLU:
        # columns come in (gate i, up i) pairs
        gate, up = tl.split(tl.reshape(acc, (BM, BW // 2, 2)))  # [BM, BW // 2] each
        cols = tl.program_id(0) * (BW // 2) + tl.arange(0, BW // 2)
        out = gate * tl.sigmoid(gate) * up
        tl.store(y_rows + cols[None, :], out.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & (cols < half)[None, :])
    else:
        tl.store(y_rows + rows[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & valid[None, :])


@triton.jit
def _tile_rows(pid, half, R, BW: tl.constexpr, SWIGLU: tl.constexpr):
    """The weight rows of program `pid`'s tile and which of them exist (qlinear's kernels tile the same way)."""
    j = tl.arange(0, BW)
    if SWIGLU:
        # tile row 2i is gate row c, tile row 2i + 1 is up row half + c, for output column c
        c = pid * (BW // 2) + j // 2
        rows = c + (j % 2) * half
        valid = c < half
    else:
        rows = pid * BW + j
        valid = rows < R
    return rows, valid


@triton.jit
def _finish(acc, y_ptr, part_ptr, arrive_ptr, pid, num_splits, M, R, m, mask_m, rows, valid, stride_y, half,
            BM: tl.constexpr, BW: tl.constexpr, SPLIT: tl.constexpr, SWIGLU: tl.constexpr, r_ptr, stride_r,
            RESIDUAL: tl.constexpr):
    """Store a program's [BM, BW] sums; under split-K the last split of the row block to arrive adds every split's
    partial in split order (the same sum whichever arrives last) and stores it (qlinear's kernels end here too)."""
    if SPLIT:
        # part [splits, M, R] fp32: each split's partial sums at their weight-row columns
        mask = mask_m[:, None] & valid[None, :]
        offs = m[:, None] * R + rows[None, :]  # [BM, BW]
        tl.store(part_ptr + tl.program_id(1) * M * R + offs, acc, mask=mask)
        # every thread's partial must be written before the release below publishes it
        tl.debug_barrier()
        arrived = tl.atomic_add(arrive_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == num_splits - 1:
            acc = tl.zeros((BM, BW), dtype=tl.float32)
            for s in range(0, num_splits):
                # .cg reads L2, where the other programs' partials are, never a stale L1 line
                acc += tl.load(part_ptr + s * M * R + offs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(arrive_ptr + pid, 0)
            _store(y_ptr, r_ptr, acc, m, mask_m, rows, valid, stride_y, stride_r, half, BM, BW, SWIGLU, RESIDUAL)
    else:
        _store(y_ptr, r_ptr, acc, m, mask_m, rows, valid, stride_y, stride_r, half, BM, BW, SWIGLU, RESIDUAL)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, nw_ptr, r_ptr, y_ptr, part_ptr, arrive_ptr, M, R, K, k_per, num_splits, half, eps,
                 stride_x, stride_w, stride_r, stride_y, BM: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr,
                 EVEN_K: tl.constexpr, SPLIT: tl.constexpr, SWIGLU: tl.constexpr, FP32_DOT: tl.constexpr,
                 NORM: tl.constexpr, RESIDUAL: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    pid = tl.program_id(0)
    rows, valid = _tile_rows(pid, half, R, BW, SWIGLU)
    m = tl.arange(0, BM)
    mask_m = m < M
    k_lo = tl.program_id(1) * k_per
    k_hi = tl.minimum(k_lo + k_per, K)
    if BM == 1:  # the dot-free one-row form (ONE_ROW "fma")
        acc = _fma_row(x_ptr, w_ptr, nw_ptr, stride_w, rows, valid, k_lo, k_hi, K, eps, BW, BK, EVEN_K, NORM)
    else:
        acc = _dot_rows(x_ptr, w_ptr, nw_ptr, stride_x, stride_w, m, mask_m, rows, valid, k_lo, k_hi, K, eps, BM,
                        BW, BK, EVEN_K, FP32_DOT, NORM)  # [BM, BW]
    _finish(acc, y_ptr, part_ptr, arrive_ptr, pid, num_splits, M, R, m, mask_m, rows, valid, stride_y, half, BM, BW,
            SPLIT, SWIGLU, r_ptr, stride_r, RESIDUAL)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    # off the GPU (the interpreter) the H200's count, so the tests see the GPU's configurations
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def _arrival_table(device: torch.device, blocks: int) -> torch.Tensor:
    table = _arrivals.get(device)
    if table is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("gemv: run a split-K call once before CUDA-graph capture (it allocates its counters)")
        table = _arrivals[device] = torch.zeros(_ARRIVAL_SLOTS, dtype=torch.int32, device=device)
    assert blocks <= table.numel(), f"gemv: {blocks} split-K row blocks exceed {table.numel()} arrival counters"
    return table


def _launch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None, config: GemvConfig | None, swiglu: bool,
            norm_weight: torch.Tensor | None = None, eps: float = 0.0,
            residual: torch.Tensor | None = None) -> torch.Tensor:
    M, K = x.shape
    R = w.shape[0]
    assert w.shape[1] == K and 1 <= M <= MAX_ROWS, f"gemv: x {tuple(x.shape)}, w {tuple(w.shape)}"
    assert w.stride(1) == 1 and not (swiglu and R % 2), "gemv: w must be [N, K] with contiguous rows"
    assert norm_weight is None or (norm_weight.shape == (K,) and norm_weight.stride(0) == 1), "gemv: norm [K]"
    assert residual is None or (not swiglu and residual.shape == (M, R) and residual.stride(1) == 1), \
        f"gemv: residual must be [{M}, {R}] with contiguous rows (and no SwiGLU)"
    x = x if x.stride(1) == 1 else x.contiguous()
    n_out = R // 2 if swiglu else R
    y = x.new_empty(M, n_out) if out is None else out
    assert y.shape == (M, n_out) and y.stride(1) == 1, f"gemv: out {tuple(y.shape)} != ({M}, {n_out})"
    fma = M == 1 and ONE_ROW == "fma"
    cfg = config or pick_config(M, R, K, w.element_size(), _num_sms(x.device), fma=fma)
    # whole tiles per split, and no empty split
    k_per = triton.cdiv(triton.cdiv(K, cfg.splits), cfg.bk) * cfg.bk
    splits = triton.cdiv(K, k_per)
    blocks = triton.cdiv(n_out, cfg.rows // 2) if swiglu else triton.cdiv(R, cfg.rows)
    part, arrivals = y, y
    if splits > 1:
        part = torch.empty(splits, M, R, device=x.device, dtype=torch.float32)
        arrivals = _arrival_table(x.device, blocks)
    # the interpreter's bf16 arithmetic is wrong, and fp32 operands must not be rounded to tf32
    fp32_dot = os.environ.get("TRITON_INTERPRET") == "1" or torch.float32 in (x.dtype, w.dtype)
    r = y if residual is None else residual
    norm = _NORM_NONE if norm_weight is None else (_NORM_PROLOGUE if splits > 1 else _NORM_IN_LOOP)
    on = pdl.active(x)
    _gemv_kernel[(blocks, splits)](
        x, w, x if norm_weight is None else norm_weight, r, y, part, arrivals, M, R, K, k_per, splits, n_out, eps,
        x.stride(0), w.stride(0), r.stride(0), y.stride(0),
        BM=1 if fma else MAX_ROWS, BW=cfg.rows, BK=cfg.bk, EVEN_K=K % cfg.bk == 0, SPLIT=splits > 1, SWIGLU=swiglu,
        FP32_DOT=fp32_dot, NORM=norm, RESIDUAL=residual is not None, PDL=on, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **pdl.launch(on))
    return y


def gemv(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, config: GemvConfig | None = None,
         norm_weight: torch.Tensor | None = None, eps: float = 0.0,
         residual: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w)`` for 1 <= M <= 16 rows, fp32 accumulation. x [M, K] (any row stride); w [N, K] bf16, fp16
    or fp32 with contiguous rows (a row slice of a larger weight works). Returns [M, N] in x's dtype, or writes
    ``out`` ([M, N], any float dtype, contiguous rows). ``config`` overrides the shape heuristic (benchmarks).

    ``norm_weight`` [K]: x is first ``rmsnorm(x) * (1 + norm_weight)`` (``eps`` inside the root). ``residual``
    [M, N]: returns ``residual + x @ w^T``; ``out=residual`` updates the residual stream in place."""
    return _launch(x, w, out, config, False, norm_weight, eps, residual)


def gemv_swiglu(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, config: GemvConfig | None = None,
                norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """``silu(x @ gate^T) * (x @ up^T)`` for w [2I, K] = [gate | up] rows, in fp32 until the one rounding on the
    store. Returns [M, I] in x's dtype (or writes ``out``); ``norm_weight`` as for ``gemv``; otherwise as ``gemv``."""
    return _launch(x, w, out, config, True, norm_weight, eps)
