"""Fused sampling kernels: steps 1-9 of docs/sampling.md over V blocks, with a second reduction stage.

    adjust  (B x V blocks)  logits -> steps 1-4 -> block max/argmax and NaN/+inf/all-masked flags;
                            random rows also store z = x / T (step 5) in the workspace
    cutoff  (torch, the sort variants only, ``cutoff.py``)  top-k and top-p as a rank cutoff: one stable sort per
            row, or the top ``top_k_bound`` values when every row's top-k is at most that
    race    (B x V blocks)  random rows: cutoff, min-p, Gumbel noise (Philox), block argmax of f64(z) + f64(g)
    finish  (B)             status, then the greedy argmax or the race winner, ties to the lowest id

Every division is ``div_rn`` and every launch has ``enable_fp_fusion=False``, so each float32 step rounds exactly
as the host's torch code (docs/sampling.md section 5). No kernel reads a device value back on the host: per-row
choices are runtime branches on the row's flags, grids depend on shapes only, so a CUDA graph captures the lot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.random import philox_impl

from . import layout as L
from .cutoff import bounded_cutoff, truncation_cutoff
from .layout import SampleInputs

_ROW, _TOP_K, _SEED, _POS, _FLAGS = (tl.constexpr(c) for c in (L.ROW, L.TOP_K, L.SEED, L.POSITION, L.FLAGS))
_TEMP, _MIN_P, _REP, _FREQ, _PRES = (tl.constexpr(c) for c in (L.TEMPERATURE, L.MIN_P, L.REPETITION, L.FREQUENCY,
                                                                  L.PRESENCE))
_GREEDY, _MASK, _BIAS, _MIN_TOKENS = (tl.constexpr(c) for c in (L.GREEDY, L.MASK, L.BIAS, L.MIN_TOKENS))
_REP_ON, _FREQ_ON, _PRES_ON = (tl.constexpr(c) for c in (L.REPETITION_ON, L.FREQUENCY_ON, L.PRESENCE_ON))
_OK, _BAD, _EMPTY = (tl.constexpr(c) for c in (L.OK, L.BAD_LOGITS, L.ALL_MASKED))
_NO_ID = tl.constexpr(2 ** 31 - 1)  # larger than any token id: loses every lowest-id tie-break


@triton.jit
def _bit(words_ptr, offs, inb):
    """Bit t % 32 of word t // 32 for every token t in offs (xgrammar's layout)."""
    w = tl.load(words_ptr + (offs >> 5), mask=inb, other=0)
    return ((w >> (offs & 31)) & 1) != 0


@triton.jit
def _penalties(x, fp, row, counts_ptr, seen_ptr, offs, inb, flags, V, W):
    """Step 4 in the host's order: repetition on seen tokens, then frequency, then presence (float32, no FMA)."""
    count = tl.load(counts_ptr + row * V + offs, mask=inb, other=0)
    if flags & _REP_ON:
        seen = (count > 0) | _bit(seen_ptr + row * W, offs, inb)
        r = tl.load(fp + _REP).to(tl.float32)
        x = tl.where(seen, tl.where(x > 0, tl.math.div_rn(x, r), x * r), x)
    if flags & _FREQ_ON:
        x = x - tl.load(fp + _FREQ).to(tl.float32) * count.to(tl.float32)
    if flags & _PRES_ON:
        x = x - tl.load(fp + _PRES).to(tl.float32) * (count > 0).to(tl.float32)
    return x


@triton.jit
def _adjust_kernel(logits_ptr, ip_ptr, fp_ptr, masks_ptr, bias_ptr, blocked_ptr, seen_ptr, counts_ptr, work_ptr,
                   bmax_ptr, barg_ptr, bflag_ptr, V, W, NB, stride_l, stride_p, stride_m, stride_w,
                   BLOCK: tl.constexpr):
    b = tl.program_id(0)
    blk = tl.program_id(1)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    inb = offs < V
    ip = ip_ptr + b * stride_p
    fp = fp_ptr + b * stride_p
    row = tl.load(ip + _ROW)
    flags = tl.load(ip + _FLAGS)
    x = tl.load(logits_ptr + b * stride_l + offs, mask=inb, other=float("-inf")).to(tl.float32)
    if flags & _BIAS:
        x += tl.load(bias_ptr + row * V + offs, mask=inb, other=0.0)
    if flags & _MASK:
        x = tl.where(_bit(masks_ptr + b * stride_m, offs, inb), x, float("-inf"))
    if flags & _MIN_TOKENS:
        x = tl.where(_bit(blocked_ptr + row * W, offs, inb), float("-inf"), x)
    if flags & (_REP_ON | _FREQ_ON | _PRES_ON):
        x = _penalties(x, fp, row, counts_ptr, seen_ptr, offs, inb, flags, V, W)
    x = tl.where(inb, x, float("-inf"))
    bad = tl.max(((x != x) | (x == float("inf"))).to(tl.int32), 0)
    live = tl.max((x != float("-inf")).to(tl.int32), 0)
    top = tl.max(x, 0)
    tl.store(bmax_ptr + b * NB + blk, top)
    tl.store(barg_ptr + b * NB + blk, tl.min(tl.where(x == top, offs, _NO_ID), 0))
    tl.store(bflag_ptr + b * NB + blk, bad | (live << 1))
    if (flags & _GREEDY) == 0:
        t = tl.load(fp + _TEMP).to(tl.float32)
        tl.store(work_ptr + b * stride_w + offs, tl.math.div_rn(x, t), mask=inb)


@triton.jit
def _philox_bits(seed, position, offs, stream):
    """The uint32 of docs/sampling.md section 4 for vocabulary indices offs: Philox-4x32-10 keyed by the seed,
    counter (i >> 2, position lo, position hi, stream), word i & 3 (position: a scalar or offs' shape)."""
    seed = seed.to(tl.uint64)
    position = position.to(tl.uint64)
    c0 = (offs >> 2).to(tl.uint32)
    zero = c0 * 0
    c1 = zero + (position & 0xFFFFFFFF).to(tl.uint32)
    c2 = zero + ((position >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c3 = zero + stream
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    w0, w1, w2, w3 = philox_impl(c0, c1, c2, c3, k0, k1)
    lane = offs & 3
    return tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))


@triton.jit
def _uniform(bits):
    """uint32 -> float32 in (0, 1): (2 * (bits >> 9) + 1) * 2^-24, exact."""
    return ((bits >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def _gumbel(seed, position, offs, stream):
    """Gumbel noise of draw `stream` for vocabulary indices offs: -log(-log(u)) in float64, rounded once."""
    u = _uniform(_philox_bits(seed, position, offs, stream))
    return (-tl.log(-tl.log(u.to(tl.float64)))).to(tl.float32)


@triton.jit
def _race_kernel(work_ptr, ip_ptr, fp_ptr, bmax_ptr, tau_ptr, tid_ptr, smax_ptr, sarg_ptr, V, NB, stride_p,
                 stride_w, SORT: tl.constexpr, BLOCK: tl.constexpr, NB_BLOCK: tl.constexpr):
    b = tl.program_id(0)
    blk = tl.program_id(1)
    ip = ip_ptr + b * stride_p
    fp = fp_ptr + b * stride_p
    if (tl.load(ip + _FLAGS) & _GREEDY) != 0:
        return
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    inb = offs < V
    z = tl.load(work_ptr + b * stride_w + offs, mask=inb, other=float("-inf"))
    if SORT:
        # top-k and top-p keep a prefix of the (z desc, id asc) order: everything up to its last (value, id)
        tau = tl.load(tau_ptr + b)
        tid = tl.load(tid_ptr + b)
        z = tl.where((z > tau) | ((z == tau) & (offs <= tid)), z, float("-inf"))
    min_p = tl.load(fp + _MIN_P)
    if min_p > 0:
        # max z = rn(max x / T): rounding is monotone, and truncation always keeps the most likely token
        nb = tl.arange(0, NB_BLOCK)
        xmax = tl.max(tl.load(bmax_ptr + b * NB + nb, mask=nb < NB, other=float("-inf")), 0)
        zmax = tl.math.div_rn(xmax, tl.load(fp + _TEMP).to(tl.float32))
        ratio = tl.exp(z.to(tl.float64) - zmax.to(tl.float64))
        z = tl.where(ratio >= min_p, z, float("-inf"))
    g = _gumbel(tl.load(ip + _SEED), tl.load(ip + _POS), offs, 0)  # STREAM_TOKEN
    score = tl.where(inb, z.to(tl.float64) + g.to(tl.float64), float("-inf"))
    best = tl.max(score, 0)
    tl.store(smax_ptr + b * NB + blk, best)
    tl.store(sarg_ptr + b * NB + blk, tl.min(tl.where(score == best, offs, _NO_ID), 0))


@triton.jit
def _finish_kernel(ip_ptr, bmax_ptr, barg_ptr, bflag_ptr, smax_ptr, sarg_ptr, picked_ptr, V, NB, stride_p,
                   RACE: tl.constexpr, NB_BLOCK: tl.constexpr):
    b = tl.program_id(0)
    nb = tl.arange(0, NB_BLOCK)
    m = nb < NB
    flag = tl.load(bflag_ptr + b * NB + nb, mask=m, other=0)
    bad = tl.max(flag & 1, 0)
    live = tl.max((flag >> 1) & 1, 0)
    status = tl.where(bad != 0, _BAD, tl.where(live != 0, _OK, _EMPTY))
    # blocks are in id order and each reports its lowest arg: the lowest block among the maxima has the lowest id
    vals = tl.load(bmax_ptr + b * NB + nb, mask=m, other=float("-inf"))
    token = tl.min(tl.where(vals == tl.max(vals, 0), tl.load(barg_ptr + b * NB + nb, mask=m, other=_NO_ID), _NO_ID),
                   0)
    if RACE:
        if (tl.load(ip_ptr + b * stride_p + _FLAGS) & _GREEDY) == 0:
            s = tl.load(smax_ptr + b * NB + nb, mask=m, other=float("-inf"))
            token = tl.min(tl.where(s == tl.max(s, 0), tl.load(sarg_ptr + b * NB + nb, mask=m, other=_NO_ID),
                                    _NO_ID), 0)
    # a row whose status is not OK has an unspecified token, but always a valid id
    tl.store(picked_ptr + b * 2, tl.minimum(token, V - 1))
    tl.store(picked_ptr + b * 2 + 1, status)


@dataclass(frozen=True)
class SampleWorkspace:
    """Scratch for ``sample`` at up to ``max_batch`` rows, allocated once (a CUDA graph reuses it every replay)."""

    block: int
    work: torch.Tensor  # [max_batch, V] float32, z of random rows
    bmax: torch.Tensor  # [max_batch, NB] float32 block max of the adjusted logits
    barg: torch.Tensor  # [max_batch, NB] int32 its lowest id
    bflag: torch.Tensor  # [max_batch, NB] int32 bit 0: NaN/+inf, bit 1: a token not -inf
    smax: torch.Tensor  # [max_batch, NB] float64 block max of the race score
    sarg: torch.Tensor  # [max_batch, NB] int32
    tau: torch.Tensor  # [max_batch] float32 rank cutoff value
    tid: torch.Tensor  # [max_batch] int64 rank cutoff id

    @classmethod
    def allocate(cls, max_batch: int, vocab: int, device: torch.device | str,
                 block_v: int = 2048) -> "SampleWorkspace":
        block = max(32, min(block_v, triton.next_power_of_2(vocab)))
        nb = triton.cdiv(vocab, block)

        def empty(*shape, dtype=torch.float32):
            return torch.empty(*shape, dtype=dtype, device=device)
        i32 = torch.int32
        return cls(block, empty(max_batch, vocab), empty(max_batch, nb), empty(max_batch, nb, dtype=i32),
                   empty(max_batch, nb, dtype=i32), empty(max_batch, nb, dtype=torch.float64),
                   empty(max_batch, nb, dtype=i32), empty(max_batch), empty(max_batch, dtype=torch.int64))


def sample(logits: torch.Tensor, inp: SampleInputs, *, race: bool = True, sort: bool = False,
           top_k_bound: int | None = None, workspace: SampleWorkspace | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``sample_naive`` with the work split over V blocks. logits [B, V] -> int32 [B, 2] (token, status).

    ``race=False`` is valid only when every row is greedy, ``sort=False`` only when no random row has top-k or top-p,
    ``top_k_bound`` only when every random row has top-k in 1..top_k_bound or neither filter (its cutoff then reads
    the top values instead of sorting the row; the caller knows its rows; the kernels never ask the device)."""
    B, V = logits.shape
    ws = workspace or SampleWorkspace.allocate(B, V, logits.device)
    out = torch.empty(B, 2, dtype=torch.int32, device=logits.device) if out is None else out
    nb = ws.bmax.shape[1]
    nb_block = triton.next_power_of_2(nb)
    W = inp.masks.shape[1]
    ip, fp = inp.iparams, inp.fparams
    assert ip.stride(0) == fp.stride(0) and ip.stride(1) == fp.stride(1) == 1, "iparams/fparams share a row layout"
    opts = dict(num_warps=8 if ws.block >= 2048 else 4, enable_fp_fusion=False)
    _adjust_kernel[(B, nb)](logits, ip, fp, inp.masks, inp.bias, inp.blocked, inp.prompt_seen, inp.counts, ws.work,
                            ws.bmax, ws.barg, ws.bflag, V, W, nb, logits.stride(0), ip.stride(0),
                            inp.masks.stride(0), ws.work.stride(0), BLOCK=ws.block, **opts)
    if race:
        if sort:
            if top_k_bound:
                bounded_cutoff(ws.work[:B], ip[:, L.TOP_K], fp[:, L.TOP_P], ws.tau[:B], ws.tid[:B], top_k_bound)
            else:
                truncation_cutoff(ws.work[:B], ip[:, L.TOP_K], fp[:, L.TOP_P], ws.tau[:B], ws.tid[:B])
        _race_kernel[(B, nb)](ws.work, ip, fp, ws.bmax, ws.tau, ws.tid, ws.smax, ws.sarg, V, nb, ip.stride(0),
                              ws.work.stride(0), SORT=sort, BLOCK=ws.block, NB_BLOCK=nb_block, **opts)
    _finish_kernel[(B,)](ip, ws.bmax, ws.barg, ws.bflag, ws.smax, ws.sarg, out, V, nb, ip.stride(0), RACE=race,
                         NB_BLOCK=nb_block, num_warps=1, enable_fp_fusion=False)
    return out
