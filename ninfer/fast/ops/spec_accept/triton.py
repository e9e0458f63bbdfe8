"""Speculative acceptance kernels: ``spec_accept_naive`` with the vocabulary split into blocks, in three launches.

    stats     (B x (k+1) x V blocks)  per verified row: block max/argmax and NaN/+inf/all-masked flags; random rows
                                      also the block's sum of exp(z - block max) for p (and q at draft rows, in
                                      float64), and at row num_drafts the bonus race's block winner (stream TOKEN)
    residual  (B x k x V blocks)      random rows: the block winner of log((p - q)+) + Gumbel (stream RESIDUAL)
    finish    (B)                     every row's accept test (greedy: argmax == draft; random: u * q(d) < p(d) with
                                      u from stream ACCEPT), the walk to the first rejection, the status of the first
                                      reached row that cannot be drawn from, the emitted tokens

Each position's outcome is independent of the others (its uniforms are keyed by its absolute position), so the
residual and the bonus are computed for every position at once and the walk only picks. No kernel reads a device
value back and grids depend on shapes only, so a CUDA graph captures the lot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer.fast.ops.sample.triton import _gumbel, _philox_bits, _uniform
from ninfer.sampling.philox import STREAM_ACCEPT, STREAM_RESIDUAL, STREAM_TOKEN

from . import layout as L

_SEED, _POS, _FLAGS, _GREEDY = (tl.constexpr(c) for c in (L.SEED, L.POSITION, L.FLAGS, L.GREEDY))
_OK, _BAD, _EMPTY = (tl.constexpr(c) for c in (L.OK, L.BAD_LOGITS, L.ALL_MASKED))
_COUNT, _STATUS, _TOKENS, _NO_TOKEN = (tl.constexpr(c) for c in (L.COUNT, L.STATUS, L.TOKENS, L.NO_TOKEN))
_S_TOKEN, _S_ACCEPT, _S_RESIDUAL = (tl.constexpr(c) for c in (STREAM_TOKEN, STREAM_ACCEPT, STREAM_RESIDUAL))
_NO_ID = tl.constexpr(2 ** 31 - 1)  # larger than any token id: loses every lowest-id tie-break


@triton.jit
def _exp_sum(x, top):
    """sum(exp(x - top)) in float64, 0 for an all -inf block (whose top is -inf too)."""
    e = tl.where(x == float("-inf"), 0.0, tl.exp(x.to(tl.float64) - top.to(tl.float64)))
    return tl.sum(e, 0)


@triton.jit
def _stats_kernel(z_ptr, q_ptr, ip_ptr, nd_ptr, bmax_ptr, barg_ptr, bflag_ptr, psum_ptr, qmax_ptr, qsum_ptr,
                  smax_ptr, sarg_ptr, V, K, NB, stride_zb, stride_zi, stride_qb, stride_qi, stride_p,
                  RANDOM: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)  # verified row b * (K + 1) + i
    blk = tl.program_id(1)
    b = r // (K + 1)
    i = r % (K + 1)
    n = tl.load(nd_ptr + b)
    if i > n:
        return
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    inb = offs < V
    z = tl.load(z_ptr + b * stride_zb + i * stride_zi + offs, mask=inb, other=float("-inf")).to(tl.float32)
    z = tl.where(inb, z, float("-inf"))
    top = tl.max(z, 0)
    at = r * NB + blk
    tl.store(bmax_ptr + at, top)
    tl.store(barg_ptr + at, tl.min(tl.where(z == top, offs, _NO_ID), 0))
    bad = tl.max(((z != z) | (z == float("inf"))).to(tl.int32), 0)
    tl.store(bflag_ptr + at, bad | (tl.max((z != float("-inf")).to(tl.int32), 0) << 1))
    if RANDOM:
        ip = ip_ptr + b * stride_p
        if (tl.load(ip + _FLAGS) & _GREEDY) == 0:
            tl.store(psum_ptr + at, _exp_sum(z, top))
            if i < n:
                zq = tl.load(q_ptr + b * stride_qb + i * stride_qi + offs, mask=inb, other=float("-inf"))
                zq = tl.where(inb, zq.to(tl.float32), float("-inf"))
                qtop = tl.max(zq, 0)
                tl.store(qmax_ptr + (b * K + i) * NB + blk, qtop)
                tl.store(qsum_ptr + (b * K + i) * NB + blk, _exp_sum(zq, qtop))
            else:  # the bonus: the ordinary draw at position + n
                g = _gumbel(tl.load(ip + _SEED), tl.load(ip + _POS) + i, offs, _S_TOKEN)
                score = tl.where(inb, z.to(tl.float64) + g.to(tl.float64), float("-inf"))
                best = tl.max(score, 0)
                tl.store(smax_ptr + b * NB + blk, best)
                tl.store(sarg_ptr + b * NB + blk, tl.min(tl.where(score == best, offs, _NO_ID), 0))


@triton.jit
def _softmax_stats(max_ptr, sum_ptr, NB, NB_BLOCK: tl.constexpr):
    """(max, sum of exp(x - max)) of one row from its block stats: the same order wherever it is evaluated."""
    nb = tl.arange(0, NB_BLOCK)
    m = nb < NB
    tops = tl.load(max_ptr + nb, mask=m, other=float("-inf"))
    top = tl.max(tops, 0)
    scale = tl.where(tops == float("-inf"), 0.0, tl.exp(tops.to(tl.float64) - top.to(tl.float64)))
    return top.to(tl.float64), tl.sum(tl.load(sum_ptr + nb, mask=m, other=0.0) * scale, 0)


@triton.jit
def _prob(x, top, total):
    """softmax probability of logits x given the row's (max, sum): 0 at -inf."""
    return tl.where(x == float("-inf"), 0.0, tl.exp(x.to(tl.float64) - top) / total)


@triton.jit
def _residual_kernel(z_ptr, q_ptr, ip_ptr, nd_ptr, bmax_ptr, psum_ptr, qmax_ptr, qsum_ptr, rmax_ptr, rarg_ptr,
                     V, K, NB, stride_zb, stride_zi, stride_qb, stride_qi, stride_p,
                     BLOCK: tl.constexpr, NB_BLOCK: tl.constexpr):
    r = tl.program_id(0)  # draft row b * K + i
    blk = tl.program_id(1)
    b = r // K
    i = r % K
    ip = ip_ptr + b * stride_p
    if (i >= tl.load(nd_ptr + b)) | ((tl.load(ip + _FLAGS) & _GREEDY) != 0):
        return
    v = b * (K + 1) + i
    pmax, ptotal = _softmax_stats(bmax_ptr + v * NB, psum_ptr + v * NB, NB, NB_BLOCK)
    qmax, qtotal = _softmax_stats(qmax_ptr + r * NB, qsum_ptr + r * NB, NB, NB_BLOCK)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    inb = offs < V
    z = tl.load(z_ptr + b * stride_zb + i * stride_zi + offs, mask=inb, other=float("-inf")).to(tl.float32)
    zq = tl.load(q_ptr + b * stride_qb + i * stride_qi + offs, mask=inb, other=float("-inf")).to(tl.float32)
    res = tl.maximum(_prob(z, pmax, ptotal) - _prob(zq, qmax, qtotal), 0.0)
    g = _gumbel(tl.load(ip + _SEED), tl.load(ip + _POS) + i, offs, _S_RESIDUAL)
    score = tl.where(inb & (res > 0), tl.log(res) + g.to(tl.float64), float("-inf"))
    best = tl.max(score, 0)
    tl.store(rmax_ptr + r * NB + blk, best)
    tl.store(rarg_ptr + r * NB + blk, tl.min(tl.where(score == best, offs, _NO_ID), 0))


@triton.jit
def _winner(max_ptr, arg_ptr, NB, NB_BLOCK: tl.constexpr):
    """The lowest id among the block maxima of one row (blocks are in id order, each reports its lowest arg)."""
    nb = tl.arange(0, NB_BLOCK)
    m = nb < NB
    vals = tl.load(max_ptr + nb, mask=m, other=float("-inf"))
    return tl.min(tl.where(vals == tl.max(vals, 0), tl.load(arg_ptr + nb, mask=m, other=_NO_ID), _NO_ID), 0)


@triton.jit
def _accept_random(z_ptr, q_ptr, ip, bmax_ptr, psum_ptr, qmax_ptr, qsum_ptr, b, i, d, live, K, NB, stride_zb,
                   stride_zi, stride_qb, stride_qi, NB_BLOCK: tl.constexpr):
    """u * q(d) < p(d) for every draft row i (a vector over positions) of batch row b."""
    nb = tl.arange(0, NB_BLOCK)
    m2 = live[:, None] & (nb < NB)[None, :]
    v = (b * (K + 1) + i)[:, None] * NB + nb[None, :]
    w = (b * K + i)[:, None] * NB + nb[None, :]
    ptops = tl.load(bmax_ptr + v, mask=m2, other=float("-inf"))
    qtops = tl.load(qmax_ptr + w, mask=m2, other=float("-inf"))
    pmax = tl.max(ptops, 1)
    qmax = tl.max(qtops, 1)
    pscale = tl.where(ptops == float("-inf"), 0.0, tl.exp(ptops.to(tl.float64) - pmax.to(tl.float64)[:, None]))
    qscale = tl.where(qtops == float("-inf"), 0.0, tl.exp(qtops.to(tl.float64) - qmax.to(tl.float64)[:, None]))
    ptotal = tl.sum(tl.load(psum_ptr + v, mask=m2, other=0.0) * pscale, 1)
    qtotal = tl.sum(tl.load(qsum_ptr + w, mask=m2, other=0.0) * qscale, 1)
    dd = tl.where(live, d, 0)
    zd = tl.load(z_ptr + b * stride_zb + i * stride_zi + dd, mask=live, other=float("-inf")).to(tl.float32)
    qd = tl.load(q_ptr + b * stride_qb + i * stride_qi + dd, mask=live, other=float("-inf")).to(tl.float32)
    p = _prob(zd, pmax.to(tl.float64), ptotal)
    q = _prob(qd, qmax.to(tl.float64), qtotal)
    u = _uniform(_philox_bits(tl.load(ip + _SEED), tl.load(ip + _POS) + i, i * 0, _S_ACCEPT))
    return live & (u.to(tl.float64) * q < p)


@triton.jit
def _finish_kernel(z_ptr, q_ptr, d_ptr, ip_ptr, nd_ptr, bmax_ptr, barg_ptr, bflag_ptr, psum_ptr, qmax_ptr, qsum_ptr,
                   smax_ptr, sarg_ptr, rmax_ptr, rarg_ptr, out_ptr, V, K, NB, stride_zb, stride_zi, stride_qb,
                   stride_qi, stride_d, stride_p, stride_o, RANDOM: tl.constexpr, K1_BLOCK: tl.constexpr,
                   NB_BLOCK: tl.constexpr):
    b = tl.program_id(0)
    ip = ip_ptr + b * stride_p
    n = tl.load(nd_ptr + b)
    i = tl.arange(0, K1_BLOCK)  # verified rows of this batch row
    nb = tl.arange(0, NB_BLOCK)
    verified = i <= n
    m2 = verified[:, None] & (nb < NB)[None, :]
    v = (b * (K + 1) + i)[:, None] * NB + nb[None, :]
    flag = tl.load(bflag_ptr + v, mask=m2, other=0)
    st = tl.where(tl.max(flag & 1, 1) != 0, _BAD, tl.where(tl.max((flag >> 1) & 1, 1) != 0, _OK, _EMPTY))
    vals = tl.load(bmax_ptr + v, mask=m2, other=float("-inf"))
    top = tl.min(tl.where(vals == tl.max(vals, 1)[:, None], tl.load(barg_ptr + v, mask=m2, other=_NO_ID), _NO_ID), 1)
    drafted = i < n
    d = tl.load(d_ptr + b * stride_d + i, mask=drafted, other=-1).to(tl.int32)
    sampled = (tl.load(ip + _FLAGS) & _GREEDY) == 0
    accepted = drafted & (top == d)
    if RANDOM:
        if sampled:
            accepted = _accept_random(z_ptr, q_ptr, ip, bmax_ptr, psum_ptr, qmax_ptr, qsum_ptr, b, i, d, drafted,
                                      K, NB, stride_zb, stride_zi, stride_qb, stride_qi, NB_BLOCK)
    j = tl.min(tl.where(accepted, K1_BLOCK, i), 0)  # accepted drafts: the first row not accepted (<= n)
    failed = (i <= j) & (st != _OK)
    first = tl.min(tl.where(failed, i, K1_BLOCK), 0)
    status = tl.sum(tl.where(i == first, st, 0), 0)
    token = tl.sum(tl.where(i == j, top, 0), 0)  # greedy: the argmax at j, a mismatch or the bonus
    if RANDOM:
        if sampled:
            if j < n:
                token = _winner(rmax_ptr + (b * K + j) * NB, rarg_ptr + (b * K + j) * NB, NB, NB_BLOCK)
            else:
                token = _winner(smax_ptr + b * NB, sarg_ptr + b * NB, NB, NB_BLOCK)
    # a failed row's tokens are unspecified, but always valid ids or NO_TOKEN
    token = tl.minimum(token, V - 1)
    row = tl.where(i < j, d, tl.where(i == j, token, _NO_TOKEN))
    o = out_ptr + b * stride_o
    tl.store(o + _TOKENS + i, row, mask=i < K + 1)
    tl.store(o + _COUNT, j + 1)
    tl.store(o + _STATUS, status)


@dataclass(frozen=True)
class SpecAcceptWorkspace:
    """Scratch for ``spec_accept`` at up to ``max_batch`` rows of k drafts, allocated once (a CUDA graph reuses it
    every replay). Block stats are indexed by verified row b * (k + 1) + i, draft stats by b * k + i."""

    block: int
    k: int
    bmax: torch.Tensor  # [max_batch * (k + 1), NB] float32 block max of z
    barg: torch.Tensor  # int32, its lowest id
    bflag: torch.Tensor  # int32, bit 0: NaN/+inf, bit 1: a token not -inf
    psum: torch.Tensor  # float64, sum of exp(z - block max)
    qmax: torch.Tensor  # [max_batch * k, NB] float32 block max of the draft logits
    qsum: torch.Tensor  # float64
    rmax: torch.Tensor  # [max_batch * k, NB] float64 block max of the residual race
    rarg: torch.Tensor  # int32
    smax: torch.Tensor  # [max_batch, NB] float64 block max of the bonus race
    sarg: torch.Tensor  # int32

    @classmethod
    def allocate(cls, max_batch: int, k: int, vocab: int, device: torch.device | str,
                 block_v: int = 2048) -> "SpecAcceptWorkspace":
        block = max(32, min(block_v, triton.next_power_of_2(vocab)))
        nb = triton.cdiv(vocab, block)
        f32, f64, i32 = torch.float32, torch.float64, torch.int32

        def empty(rows, dtype):
            return torch.empty(rows, nb, dtype=dtype, device=device)
        v, d = max_batch * (k + 1), max(1, max_batch * k)
        return cls(block, k, empty(v, f32), empty(v, i32), empty(v, i32), empty(v, f64), empty(d, f32),
                   empty(d, f64), empty(d, f64), empty(d, i32), empty(max_batch, f64), empty(max_batch, i32))


def spec_accept(target: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor, iparams: torch.Tensor,
                draft_logits: torch.Tensor | None = None, *, workspace: SpecAcceptWorkspace | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``spec_accept_naive`` on the device: target [B, k+1, V], drafts [B, k], num_drafts [B] int32, iparams
    [B, >= 5] int64, draft_logits [B, k, V] or None (valid only when every row is greedy: the caller knows its rows;
    the kernels never ask the device) -> int32 [B, 2 + k + 1]."""
    B, K1, V = target.shape
    K = K1 - 1
    assert drafts.shape == (B, K) and num_drafts.shape == (B,) and target.stride(2) == 1
    ws = workspace or SpecAcceptWorkspace.allocate(B, K, V, target.device)
    assert ws.k == K, f"workspace is for k={ws.k}, the call has k={K}"
    out = torch.empty(B, L.TOKENS + K1, dtype=torch.int32, device=target.device) if out is None else out
    nb = ws.bmax.shape[1]
    random = draft_logits is not None
    q = draft_logits if random else target  # never read by an all-greedy launch
    assert q.stride(2) == 1
    strides = (target.stride(0), target.stride(1), q.stride(0), q.stride(1))
    opts = dict(num_warps=8 if ws.block >= 2048 else 4, enable_fp_fusion=False)
    _stats_kernel[(B * K1, nb)](target, q, iparams, num_drafts, ws.bmax, ws.barg, ws.bflag, ws.psum, ws.qmax,
                                ws.qsum, ws.smax, ws.sarg, V, K, nb, *strides, iparams.stride(0), RANDOM=random,
                                BLOCK=ws.block, **opts)
    nb_block = triton.next_power_of_2(nb)
    if random and K > 0:
        _residual_kernel[(B * K, nb)](target, q, iparams, num_drafts, ws.bmax, ws.psum, ws.qmax, ws.qsum, ws.rmax,
                                      ws.rarg, V, K, nb, *strides, iparams.stride(0), BLOCK=ws.block,
                                      NB_BLOCK=nb_block, **opts)
    _finish_kernel[(B,)](target, q, drafts, iparams, num_drafts, ws.bmax, ws.barg, ws.bflag, ws.psum, ws.qmax,
                         ws.qsum, ws.smax, ws.sarg, ws.rmax, ws.rarg, out, V, K, nb, *strides, drafts.stride(0),
                         iparams.stride(0), out.stride(0), RANDOM=random, K1_BLOCK=triton.next_power_of_2(K1),
                         NB_BLOCK=nb_block, num_warps=4, enable_fp_fusion=False)
    return out
