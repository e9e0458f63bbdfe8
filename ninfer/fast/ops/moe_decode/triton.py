"""The sparse MoE block at decode (M <= 8 rows) in two launches after the router GEMV, for dense (bf16/fp16/fp32)
expert stacks; ``naive.py`` is the definition.

``_gate_up_kernel``, grid (M*k pair slots + 1 shared slot, N tiles): a program first routes its own row (fp32
logits, k argmax rounds, ties to the lower id, as the ``moe`` op's router) and takes the expert of its slot. The
expert is streamed by the program of the first row that chose it: every row's rank of that expert is one compare
over the logits [M, E] (no second round of argmaxes), so a slot whose expert an earlier row also chose does no work
and each chosen expert's tile is read once for all its rows. The shared expert is the last slot, chosen by every
row. The program writes silu(gate) * up for its N columns of every row that chose the expert into an fp32 scratch
[M*k + M, I] (pair row m*k + slot, shared rows after), and the slot-0 programs write their row's ids and weights.

``_down_kernel``, grid (H tiles): a program owns BN output columns of every row and sums the shared expert (its
activation pre-scaled by the sigmoid gate) and then every chosen expert (the routing weight folded into the
activation) over one flat loop of (pair, K tile) steps, the same dedup rule skipping repeated experts: the
combine is that fixed-order sum, so no atomics, no third launch, deterministic. An optional residual [M, H] is added
in the epilogue (the block rounded to its dtype first), in place.

FP8 expert stacks (``QuantWeight`` of kind FP8: e4m3 [E, N, K] with fp32 scales per block of BR rows x BC
columns, the shared expert likewise) stream their bytes as stored: each loaded weight tile is converted to fp32 and
multiplied by its blocks' scales (one row of the small scale plane where the tile's rows share a block of rows, else
a gathered [BN, BK] tile, from L1/L2), which is the format's dequantization (``moe_decode_naive`` over the
dequantized stacks is the definition), at half the bytes of bf16.

No ``tl.dot`` (its smallest tile is 16 rows): rows are a broadcast dimension, products accumulate per (row, column,
k) in fp32 registers and are summed once after the loop, as ``qlinear``'s dot-free GEMV. Tiles keep that
accumulator at 32 fp32 registers a thread (``_ACC_PER_THREAD``) and the pipelined loads of one program well under
Hopper's shared memory (``smem_bytes``, asserted at every launch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl

from ninfer.fast.ops.gemv.triton import _num_sms
from ninfer.fast.ops.qlinear.layout import QKind, QuantWeight

MAX_ROWS = 8
# fp32 accumulator registers a thread spends: the loaded tiles and their fp32 copies take about as many again
# (sm_90 builds on the CPU: at 32, M = 1 gate_up needs 111 registers, 4 programs an SM; at 64 (gate_bn 16, K 256)
# 255 and 2; M = 8 gate_up 64 and down 80 registers at 8 warps, no spills)
_ACC_PER_THREAD = 32
# the most shared memory one program's pipelined loads may take (Hopper has 227 KB a block; leave room)
SMEM_LIMIT = 128 << 10


@dataclass(frozen=True)
class MoeDecodeConfig:
    gate_bn: int  # activation columns per gate_up program (it streams 2 * gate_bn weight rows: gate and up)
    gate_bk: int  # K (hidden) tile of gate_up
    down_bn: int  # output (hidden) columns per down program
    down_bk: int  # K (intermediate) tile of down
    num_warps: int = 4
    num_stages: int = 3


def _pow2_at_most(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def smem_bytes(cfg: MoeDecodeConfig, M: int, w_bytes: int, x_bytes: int) -> int:
    """Shared memory of the larger kernel's pipeline: stages x one step's tiles. gate_up loads gate and up tiles
    [gate_bn, gate_bk] and x [BM, gate_bk]; down a weight tile [down_bn, down_bk] and fp32 activations
    [BM, down_bk]. E.g. M=1, bf16, 35B-A3B: gate 3 x (2*16*128*2 + 128*2) = 25 KB, down 3 x (4*512*2 + 512*4)
    = 18 KB; fp32 weights double the weight part (gate 50 KB). Triton pipelines only loads that feed tl.dot
    through shared memory, so the compiled kernels use at most 2 KB (sm_90 builds): this bounds the other case."""
    bm = triton.next_power_of_2(M)
    gate = 2 * cfg.gate_bn * cfg.gate_bk * w_bytes + bm * cfg.gate_bk * x_bytes
    down = cfg.down_bn * cfg.down_bk * w_bytes + bm * cfg.down_bk * 4
    return cfg.num_stages * max(gate, down)


def pick_config(M: int, H: int, I: int, num_sms: int) -> MoeDecodeConfig:
    """From shapes only (graphs stay valid). N tiles are the widest that still give gate_up about four programs per
    SM at M = 1 and two from M = 2 (k + 1 slots x I / gate_bn tiles), down about two (H / down_bn); K tiles fill the
    accumulator budget, 8 warps from 3 rows. Measured on the H100 at 35B-A3B (``bench_moe.py``, docs/ops.md): at
    M = 1 gate_bn 8 (9 x 64 = 576 programs, K 256) 33.1 us a block, against 39.9 us with 16 (288 programs, K 128,
    one wave) and 34.0 with 16 at K 256; at M = 2 the two-per-SM tiles beat every swept configuration."""
    warps = 4 if M <= 2 else 8
    budget = _ACC_PER_THREAD * 32 * warps  # fp32 accumulator elements of one program
    bm = triton.next_power_of_2(M)
    slots = 9  # 35B-A3B's 8 routed experts and the shared one
    gate_per_sm = 4 if M == 1 else 2
    gate_bn = min(64, max(8, _pow2_at_most(max(1, slots * I // (gate_per_sm * num_sms)))))
    down_bn = min(32, max(4, _pow2_at_most(max(1, H // (2 * num_sms)))))
    gate_bk = max(16, min(triton.next_power_of_2(H), budget // (2 * bm * gate_bn)))
    down_bk = max(16, min(triton.next_power_of_2(I), budget // (bm * down_bn)))
    return MoeDecodeConfig(gate_bn, gate_bk, down_bn, down_bk, warps)


@triton.jit
def _route_row(logit_ptr, t, E, stride_l, s, TOPK: tl.constexpr, RENORM: tl.constexpr, BE: tl.constexpr,
               BKK: tl.constexpr):
    """Row t's top-k by fp32 logit (k argmax rounds, ties to the lower id): (the expert of slot s, ids [BKK] int32,
    weights [BKK] fp32: softmax over all experts at the ids, renormalised when RENORM)."""
    ex = tl.arange(0, BE)
    me = ex < E
    lg = tl.load(logit_ptr + t.to(tl.int64) * stride_l + ex, mask=me, other=float("-inf")).to(tl.float32)
    p = tl.exp(lg - tl.max(lg, axis=0))
    p = tl.where(me, p / tl.sum(p, axis=0), 0.0)
    left = tl.where(me, lg, float("-inf"))
    kk = tl.arange(0, BKK)
    ids = tl.zeros([BKK], dtype=tl.int32)
    wts = tl.zeros([BKK], dtype=tl.float32)
    for r in tl.static_range(TOPK):
        idx = tl.argmax(left, axis=0).to(tl.int32)
        ids = tl.where(kk == r, idx, ids)
        wts = tl.where(kk == r, tl.sum(tl.where(ex == idx, p, 0.0), axis=0), wts)
        left = tl.where(ex == idx, float("-inf"), left)
    if RENORM:
        wts = wts / tl.sum(tl.where(kk < TOPK, wts, 0.0), axis=0)
    return tl.sum(tl.where(kk == s, ids, 0), axis=0), ids, wts


@triton.jit
def _rows_choosing(logit_ptr, e, m, mask_m, E, stride_l, TOPK: tl.constexpr, BE: tl.constexpr):
    """Which rows [BM] rank expert e among their top k, and at which slot (the rank: the experts with a higher
    logit, or an equal one and a lower id, in front of it)."""
    ex = tl.arange(0, BE)
    rows = logit_ptr + m[:, None].to(tl.int64) * stride_l
    lg = tl.load(rows + ex[None, :], mask=mask_m[:, None] & (ex < E)[None, :], other=float("-inf")).to(tl.float32)
    le = tl.load(logit_ptr + m.to(tl.int64) * stride_l + e, mask=mask_m, other=0.0).to(tl.float32)  # [BM]
    ahead = (lg > le[:, None]) | ((lg == le[:, None]) & (ex < e)[None, :])
    rank = tl.sum(ahead.to(tl.int32), axis=1)
    return mask_m & (rank < TOPK), rank


@triton.jit
def _scales(scale_rows, first_row, k, mask_n, K, BC, ONE_BLOCK: tl.constexpr):
    """The FP8 scales of a weight tile's entries, to multiply the loaded [BN, BK] tile by: with ONE_BLOCK (the
    tile's rows inside one block of rows) the block row `first_row` at column blocks k // BC, [1, BK]; else each
    row's, scale_rows [BN, 1] at k // BC, [BN, BK] (twice the registers: gate_up at one row of 35B-A3B then holds 187
    a thread, 2 programs an SM). fp32; 0 past the rows or K, where the weights load as 0 too."""
    if ONE_BLOCK:
        s = tl.load(first_row + k // BC, mask=k < K, other=0.0).to(tl.float32)[None, :]
    else:
        s = tl.load(scale_rows + (k // BC)[None, :], mask=mask_n[:, None] & (k < K)[None, :], other=0.0).to(tl.float32)
    return s


@triton.jit
def _gate_up_kernel(x_ptr, logit_ptr, w_ptr, sw_ptr, act_ptr, ids_ptr, rw_ptr, ws_ptr, sws_ptr, M, E, I, IS, H,
                    BR, BC, stride_x, stride_l, stride_we, stride_wn, stride_sn, stride_act, stride_wse, stride_wsn,
                    stride_swsn, TOPK: tl.constexpr, RENORM: tl.constexpr, BM: tl.constexpr, BE: tl.constexpr,
                    BKK: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, FP8: tl.constexpr,
                    ONE_BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    j = tl.program_id(0)  # (row t, slot s) pair t * TOPK + s, or M * TOPK: the shared expert
    P = M * TOPK
    t = j // TOPK
    s = j % TOPK
    shared = j >= P
    m = tl.arange(0, BM)
    mask_m = m < M
    # the shared slot routes row M - 1 for nothing (no row M to read)
    e, ids, wts = _route_row(logit_ptr, tl.minimum(t, M - 1), E, stride_l, s, TOPK, RENORM, BE, BKK)
    kk = tl.arange(0, BKK)
    # the slot-0 program of each row publishes the row's routing for the down launch
    publish = (s == 0) & (tl.program_id(1) == 0) & (t < M)
    # scalar conditions enter masks as bounds: the interpreter rejects a scalar & vector mask
    n_pub = tl.where(publish, TOPK, 0)
    tl.store(ids_ptr + t * TOPK + kk, ids, mask=kk < n_pub)
    tl.store(rw_ptr + t * TOPK + kk, wts, mask=kk < n_pub)
    chosen, rank = _rows_choosing(logit_ptr, e, m, mask_m, E, stride_l, TOPK, BE)
    # the first row that chose the expert streams it; the shared slot is every row's
    active = (tl.min(tl.where(chosen, m, BM), axis=0) == t) | shared
    chosen = tl.where(shared, mask_m, chosen)
    out_rows = tl.where(shared, P + m, m * TOPK + rank)  # [BM] scratch rows
    if shared:
        w_rows = sw_ptr
        s_base = sws_ptr
    else:
        w_rows = w_ptr + e.to(tl.int64) * stride_we
        s_base = ws_ptr + e.to(tl.int64) * stride_wse
    stride_n = tl.where(shared, stride_sn, stride_wn)
    stride_s = tl.where(shared, stride_swsn, stride_wsn)
    half = tl.where(shared, IS, I)  # gate rows [0, half), up rows [half, 2 half)
    # a tile past this expert's width (I != Is) streams nothing
    active = active & (tl.program_id(1) * BN < half)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    mask_n = n < tl.where(active, half, 0)
    gate_rows = w_rows + n[:, None].to(tl.int64) * stride_n  # [BN, 1]
    up_rows = gate_rows + half.to(tl.int64) * stride_n
    gate_scales = s_base + (n // BR)[:, None].to(tl.int64) * stride_s  # [BN, 1] (FP8: the rows' scale blocks)
    up_scales = s_base + ((n + half) // BR)[:, None].to(tl.int64) * stride_s
    n0 = tl.program_id(1) * BN
    gate_block = s_base + (n0 // BR).to(tl.int64) * stride_s  # ONE_BLOCK: the tile's block row
    up_block = s_base + ((n0 + half) // BR).to(tl.int64) * stride_s
    x_rows = x_ptr + m[:, None].to(tl.int64) * stride_x  # [BM, 1]
    k_end = tl.where(active, H, 0)
    kt = tl.arange(0, BK)
    acc_g = tl.zeros([BM, BN, BK], dtype=tl.float32)
    acc_u = tl.zeros([BM, BN, BK], dtype=tl.float32)
    for k0 in range(0, k_end, BK):
        k = k0 + kt
        if EVEN_K:
            x = tl.load(x_rows + k[None, :], mask=chosen[:, None], other=0.0).to(tl.float32)  # [BM, BK]
            g = tl.load(gate_rows + k[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)  # [BN, BK]
            u = tl.load(up_rows + k[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        else:
            mk = (k < H)[None, :]
            x = tl.load(x_rows + k[None, :], mask=chosen[:, None] & mk, other=0.0).to(tl.float32)
            g = tl.load(gate_rows + k[None, :], mask=mask_n[:, None] & mk, other=0.0).to(tl.float32)
            u = tl.load(up_rows + k[None, :], mask=mask_n[:, None] & mk, other=0.0).to(tl.float32)
        if FP8:
            g = g * _scales(gate_scales, gate_block, k, mask_n, H, BC, ONE_BLOCK)
            u = u * _scales(up_scales, up_block, k, mask_n, H, BC, ONE_BLOCK)
        if BM == 1:
            # one row of x as a vector in the weight tile's layout: no 3-D broadcast to convert into
            xv = tl.sum(x, axis=0)[None, :]
            acc_g += (g * xv)[None, :, :]
            acc_u += (u * xv)[None, :, :]
        else:
            acc_g += g[None, :, :] * x[:, None, :]
            acc_u += u[None, :, :] * x[:, None, :]
    gate = tl.sum(acc_g, axis=2)  # [BM, BN]
    act = gate * tl.sigmoid(gate) * tl.sum(acc_u, axis=2)
    dst = act_ptr + out_rows[:, None].to(tl.int64) * stride_act + n[None, :]
    tl.store(dst, act, mask=chosen[:, None] & mask_n[None, :])


@triton.jit
def _down_kernel(act_ptr, logit_ptr, ids_ptr, rw_ptr, w_ptr, sw_ptr, r_ptr, y_ptr, ws_ptr, sws_ptr, M, E, I, IS, H,
                 BR, BC, stride_l, stride_we, stride_wn, stride_sn, stride_act, stride_r, stride_y, stride_wse,
                 stride_wsn, stride_swsn, TOPK: tl.constexpr, HAS_SHARED: tl.constexpr, RESIDUAL: tl.constexpr,
                 BM: tl.constexpr, BKK: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FP8: tl.constexpr,
                 ONE_BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    mask_n = n < H
    m = tl.arange(0, BM)
    mask_m = m < M
    P = M * TOPK
    kt = tl.arange(0, BK)
    acc = tl.zeros([BM, BN, BK], dtype=tl.float32)
    if HAS_SHARED:
        gate = tl.sigmoid(tl.load(logit_ptr + m.to(tl.int64) * stride_l + E, mask=mask_m, other=0.0).to(tl.float32))
        a_rows = act_ptr + (P + m)[:, None].to(tl.int64) * stride_act
        w_rows = sw_ptr + n[:, None].to(tl.int64) * stride_sn
        s_rows = sws_ptr + (n // BR)[:, None].to(tl.int64) * stride_swsn
        s_block = sws_ptr + (tl.program_id(0) * BN // BR).to(tl.int64) * stride_swsn
        for k0 in range(0, IS, BK):
            k = k0 + kt
            mk = (k < IS)[None, :]
            a = tl.load(a_rows + k[None, :], mask=mask_m[:, None] & mk, other=0.0) * gate[:, None]  # [BM, BK]
            w = tl.load(w_rows + k[None, :], mask=mask_n[:, None] & mk, other=0.0).to(tl.float32)  # [BN, BK]
            if FP8:
                w = w * _scales(s_rows, s_block, k, mask_n, IS, BC, ONE_BLOCK)
            acc += w[None, :, :] * a[:, None, :]
    kk = tl.arange(0, BKK)
    pm = mask_m[:, None] & (kk < TOPK)[None, :]
    ids = tl.load(ids_ptr + m[:, None] * TOPK + kk[None, :], mask=pm, other=-1)  # [BM, BKK]
    rws = tl.load(rw_ptr + m[:, None] * TOPK + kk[None, :], mask=pm, other=0.0)
    kts = tl.cdiv(I, BK)
    for step in range(0, P * kts):
        j = step // kts
        k = (step % kts) * BK + kt
        e = tl.load(ids_ptr + j)
        match = ids == e  # [BM, BKK]: each row holds an expert at most once
        chosen = tl.sum(match.to(tl.int32), axis=1) > 0
        active = tl.min(tl.where(chosen, m, BM), axis=0) == j // TOPK
        slot = tl.sum(tl.where(match, kk[None, :], 0), axis=1)
        wgt = tl.sum(tl.where(match, rws, 0.0), axis=1)  # [BM]
        mk = (k < tl.where(active, I, 0))[None, :]
        a_rows = act_ptr + (m * TOPK + slot)[:, None].to(tl.int64) * stride_act
        a = tl.load(a_rows + k[None, :], mask=chosen[:, None] & mk, other=0.0) * wgt[:, None]
        w_rows = w_ptr + e.to(tl.int64) * stride_we + n[:, None].to(tl.int64) * stride_wn
        w = tl.load(w_rows + k[None, :], mask=mask_n[:, None] & mk, other=0.0).to(tl.float32)
        if FP8:
            s_base = ws_ptr + e.to(tl.int64) * stride_wse
            s_rows = s_base + (n // BR)[:, None].to(tl.int64) * stride_wsn
            s_block = s_base + (tl.program_id(0) * BN // BR).to(tl.int64) * stride_wsn
            w = w * _scales(s_rows, s_block, k, mask_n, tl.where(active, I, 0), BC, ONE_BLOCK)
        acc += w[None, :, :] * a[:, None, :]
    out = tl.sum(acc, axis=2)  # [BM, BN]
    mask = mask_m[:, None] & mask_n[None, :]
    if RESIDUAL:
        # the block rounded to the stream's dtype, then the add rounded again: what the unfused add computes
        r = tl.load(r_ptr + m[:, None].to(tl.int64) * stride_r + n[None, :], mask=mask, other=0.0)
        out = out.to(r.dtype).to(tl.float32) + r.to(tl.float32)
    tl.store(y_ptr + m[:, None].to(tl.int64) * stride_y + n[None, :], out.to(y_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class _Stack:
    """A weight as the kernels read it: `data` [.., N, K] (dense, or FP8 e4m3 codes) and, for FP8, `scales`
    [.., ceil(N / br), ceil(K / bc)] (else the data again, never read)."""

    data: torch.Tensor
    scales: torch.Tensor
    br: int = 1
    bc: int = 1

    @classmethod
    def of(cls, w: "torch.Tensor | QuantWeight") -> "_Stack":
        if isinstance(w, QuantWeight):
            return cls(w.data, w.scales, w.block_rows, min(w.block_cols, w.k))
        return cls(w, w)

    def stride_s(self, dim: int) -> int:
        return self.scales.stride(dim) if self.scales is not self.data else 0


def fp8_stacks(*parts) -> bool:
    """Whether these weights (None skipped) are FP8 QuantWeights that `moe_decode` runs as stored: e4m3 codes with
    fp32 scales per block, no per-row global scale, all with the same block."""
    ws = [p for p in parts if p is not None]
    return bool(ws) and all(isinstance(w, QuantWeight) and w.kind == QKind.FP8 and w.row_scale is None
                            and w.data.is_contiguous() and w.scales.stride(-1) == 1 for w in ws) and \
        len({(w.block_rows, min(w.block_cols, w.k), w.scales.dtype) for w in ws}) == 1


def _check(x, logits, w_gate_up, w_down, shared_gate_up, shared_down, residual, top_k) -> None:
    M, H = x.shape
    fp8 = isinstance(w_gate_up, QuantWeight)
    assert not fp8 or fp8_stacks(w_gate_up, w_down, shared_gate_up, shared_down), "moe_decode: FP8 stacks"
    E, I2, _ = w_gate_up.shape
    assert 1 <= M <= MAX_ROWS and x.stride(1) == 1, f"moe_decode: x {tuple(x.shape)} (at most {MAX_ROWS} rows)"
    assert tuple(w_gate_up.shape) == (E, I2, H) and tuple(w_down.shape) == (E, H, I2 // 2), "moe_decode: stacks"
    assert fp8 or (w_gate_up.is_contiguous() and w_down.is_contiguous()), "moe_decode: contiguous stacks"
    assert 1 <= top_k <= E
    has_shared = shared_gate_up is not None
    assert logits.shape[0] == M and logits.shape[1] >= E + has_shared and logits.stride(1) == 1, "moe_decode: logits"
    if has_shared:
        assert shared_down is not None and shared_gate_up.shape[1] == H and shared_down.shape[0] == H
        assert isinstance(shared_gate_up, QuantWeight) == fp8, "moe_decode: the shared expert in the stacks' format"
        if not fp8:
            assert shared_gate_up.stride(1) == 1 and shared_down.stride(1) == 1
            assert shared_gate_up.dtype == shared_down.dtype == w_gate_up.dtype == w_down.dtype, "moe_decode: dtypes"
    assert residual is None or (residual.shape == (M, H) and residual.stride(1) == 1), "moe_decode: residual"


def moe_decode(x: torch.Tensor, logits: torch.Tensor, w_gate_up, w_down, top_k: int,
               renormalize: bool = True, shared_gate_up=None, shared_down=None, residual: torch.Tensor | None = None,
               config: MoeDecodeConfig | None = None) -> torch.Tensor:
    """``moe_decode_naive``'s contract in two launches: x [M <= 8, H]; logits [M, E (+1)] (any row stride);
    expert stacks w_gate_up [E, 2I, H], w_down [E, H, I], dense or FP8 ``QuantWeight`` stacks (`fp8_stacks`); the
    shared expert [2Is, H] / [H, Is] in the same format, or None. Returns [M, H] in x's dtype, or with ``residual``
    adds the block to it in place and returns it. ``config`` overrides the shape heuristic (benchmarks)."""
    _check(x, logits, w_gate_up, w_down, shared_gate_up, shared_down, residual, top_k)
    M, H = x.shape
    E, I = w_gate_up.shape[0], w_gate_up.shape[1] // 2
    has_shared = shared_gate_up is not None
    IS = shared_gate_up.shape[0] // 2 if has_shared else 0
    gu, dn = _Stack.of(w_gate_up), _Stack.of(w_down)
    sgu, sdn = (_Stack.of(shared_gate_up), _Stack.of(shared_down)) if has_shared else (gu, dn)
    fp8 = isinstance(w_gate_up, QuantWeight)
    cfg = config or pick_config(M, H, I, _num_sms(x.device))
    smem = smem_bytes(cfg, M, gu.data.element_size(), x.element_size())
    assert smem <= SMEM_LIMIT, f"moe_decode: {cfg} needs {smem} bytes of shared memory"
    P = M * top_k
    act = torch.empty(P + M * has_shared, max(I, IS), device=x.device, dtype=torch.float32)
    ids = torch.empty(M, top_k, device=x.device, dtype=torch.int32)
    rw = torch.empty(M, top_k, device=x.device, dtype=torch.float32)
    bm, bkk = triton.next_power_of_2(M), triton.next_power_of_2(top_k)
    on = pdl.active(x)
    common = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages, FP8=fp8, PDL=on, **pdl.launch(on))
    # FP8: a tile's rows inside one block of rows (gate and up halves, and the shared expert's, on block bounds)
    gate_one = fp8 and gu.br % cfg.gate_bn == 0 and I % gu.br == 0 and IS % gu.br == 0
    down_one = fp8 and dn.br % cfg.down_bn == 0
    _gate_up_kernel[(P + has_shared, triton.cdiv(max(I, IS), cfg.gate_bn))](
        x, logits, gu.data, sgu.data, act, ids, rw, gu.scales, sgu.scales, M, E, I, IS, H, gu.br, gu.bc,
        x.stride(0), logits.stride(0), gu.data.stride(0), gu.data.stride(1), sgu.data.stride(0), act.stride(0),
        gu.stride_s(0), gu.stride_s(1), sgu.stride_s(-2), TOPK=top_k, RENORM=renormalize, BM=bm,
        BE=triton.next_power_of_2(E), BKK=bkk, BN=cfg.gate_bn, BK=cfg.gate_bk, EVEN_K=H % cfg.gate_bk == 0,
        ONE_BLOCK=gate_one, **common)
    y = residual if residual is not None else x.new_empty(M, H)
    r = residual if residual is not None else y
    _down_kernel[(triton.cdiv(H, cfg.down_bn),)](
        act, logits, ids, rw, dn.data, sdn.data, r, y, dn.scales, sdn.scales, M, E, I, IS, H, dn.br, dn.bc,
        logits.stride(0), dn.data.stride(0), dn.data.stride(1), sdn.data.stride(0), act.stride(0), r.stride(0),
        y.stride(0), dn.stride_s(0), dn.stride_s(1), sdn.stride_s(-2), TOPK=top_k, HAS_SHARED=has_shared,
        RESIDUAL=residual is not None, BM=bm, BKK=bkk, BN=cfg.down_bn, BK=cfg.down_bk, ONE_BLOCK=down_one, **common)
    return y
