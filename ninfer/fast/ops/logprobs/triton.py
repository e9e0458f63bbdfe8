"""Raw logprobs over V blocks, for the rows that ask (num >= 0); the others return at once.

    stats   (B x V blocks)  block max m_b and sum exp(x - m_b) of the raw logits
    select  (B x V blocks)  row max and log-sum-exp from the stats; lp = (x - max) - lse as torch rounds it; the
                            block's count of tokens more likely than the chosen one, and its num best (lp, id)
    merge   (B)             rank, the chosen logprob, and the num best of all block candidates

The global top-n is within the union of every block's top-n, so the merge is exact, ties to the lower id included.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .layout import CHOSEN, COLUMNS, MAX_TOP, RANK, TOP_IDS, TOP_VALUES

_RANK, _CHOSEN, _TOP_IDS, _TOP_VALUES, _MAX_TOP = (tl.constexpr(c) for c in (RANK, CHOSEN, TOP_IDS, TOP_VALUES,
                                                                             MAX_TOP))
_NO_ID = tl.constexpr(2 ** 31 - 1)  # larger than any token id: loses every lowest-id tie-break


@triton.jit
def _stats_kernel(logits_ptr, num_ptr, bm_ptr, bs_ptr, V, NB, stride_l, stride_n, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    blk = tl.program_id(1)
    if tl.load(num_ptr + b * stride_n) < 0:
        return
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + b * stride_l + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    # an all -inf block sums exp(-inf) = 0 instead of exp(-inf - -inf) = NaN
    s = tl.sum(tl.exp(x - tl.where(m == float("-inf"), 0.0, m)), 0)
    tl.store(bm_ptr + b * NB + blk, m)
    tl.store(bs_ptr + b * NB + blk, s)


@triton.jit
def _row_lse(bm_ptr, bs_ptr, b, NB, NB_BLOCK: tl.constexpr):
    """(row max, log of the row's sum exp(x - max)) from the block stats."""
    nb = tl.arange(0, NB_BLOCK)
    bm = tl.load(bm_ptr + b * NB + nb, mask=nb < NB, other=float("-inf"))
    bs = tl.load(bs_ptr + b * NB + nb, mask=nb < NB, other=0.0)
    m = tl.max(bm, 0)
    total = tl.sum(bs * tl.exp(bm - tl.where(m == float("-inf"), 0.0, m)), 0)
    return m, tl.log(total)


@triton.jit
def _select_kernel(logits_ptr, num_ptr, tok_ptr, bm_ptr, bs_ptr, cnt_ptr, cid_ptr, cval_ptr, V, NB, stride_l,
                   stride_n, stride_t, BLOCK: tl.constexpr, NB_BLOCK: tl.constexpr):
    b = tl.program_id(0)
    blk = tl.program_id(1)
    num = tl.minimum(tl.load(num_ptr + b * stride_n), V)
    if num < 0:
        return
    m, lse = _row_lse(bm_ptr, bs_ptr, b, NB, NB_BLOCK)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    inb = offs < V
    x = tl.load(logits_ptr + b * stride_l + offs, mask=inb, other=float("-inf")).to(tl.float32)
    # torch's log_softmax rounds (x - max) first, then subtracts the log-sum-exp
    lp = tl.where(inb, (x - m) - lse, float("-inf"))
    chosen = (tl.load(logits_ptr + b * stride_l + tl.load(tok_ptr + b * stride_t)).to(tl.float32) - m) - lse
    tl.store(cnt_ptr + b * NB + blk, tl.sum((lp > chosen).to(tl.int32), 0))
    avail = inb
    base = (b * NB + blk) * _MAX_TOP
    for j in range(num):
        best = tl.max(tl.where(avail, lp, float("-inf")), 0)
        pick = tl.min(tl.where(avail & (lp == best), offs, _NO_ID), 0)
        tl.store(cid_ptr + base + j, pick)
        tl.store(cval_ptr + base + j, best)
        avail = avail & (offs != pick)


@triton.jit
def _merge_kernel(logits_ptr, num_ptr, tok_ptr, bm_ptr, bs_ptr, cnt_ptr, cid_ptr, cval_ptr, out_ptr, outf_ptr, V,
                  NB, stride_l, stride_n, stride_t, stride_o, NB_BLOCK: tl.constexpr, TOP_BLOCK: tl.constexpr):
    b = tl.program_id(0)
    num = tl.minimum(tl.load(num_ptr + b * stride_n), V)
    if num < 0:
        return
    m, lse = _row_lse(bm_ptr, bs_ptr, b, NB, NB_BLOCK)
    out = out_ptr + b * stride_o
    outf = outf_ptr + b * stride_o
    nb = tl.arange(0, NB_BLOCK)
    tl.store(out + _RANK, 1 + tl.sum(tl.load(cnt_ptr + b * NB + nb, mask=nb < NB, other=0), 0))
    chosen = (tl.load(logits_ptr + b * stride_l + tl.load(tok_ptr + b * stride_t)).to(tl.float32) - m) - lse
    tl.store(outf + _CHOSEN, chosen)
    j = tl.arange(0, TOP_BLOCK)
    avail = (nb[:, None] < NB) & (j[None, :] < num)  # [NB_BLOCK, TOP_BLOCK]
    at = (b * NB + nb[:, None]) * _MAX_TOP + j[None, :]
    ids = tl.load(cid_ptr + at, mask=avail, other=_NO_ID)
    vals = tl.load(cval_ptr + at, mask=avail, other=float("-inf"))
    for r in range(num):
        best = tl.max(tl.max(tl.where(avail, vals, float("-inf")), 1), 0)
        pick = tl.min(tl.min(tl.where(avail & (vals == best), ids, _NO_ID), 1), 0)
        tl.store(out + _TOP_IDS + r, pick)
        tl.store(outf + _TOP_VALUES + r, best)
        avail = avail & (ids != pick)


@dataclass(frozen=True)
class LogprobsWorkspace:
    """Scratch for ``logprobs`` at up to ``max_batch`` rows, allocated once."""

    block: int
    bm: torch.Tensor  # [max_batch, NB] float32 block max
    bs: torch.Tensor  # [max_batch, NB] float32 block sum of exp(x - block max)
    count: torch.Tensor  # [max_batch, NB] int32 tokens more likely than the chosen one
    cand_ids: torch.Tensor  # [max_batch, NB, MAX_TOP] int32 each block's best ids
    cand_values: torch.Tensor  # [max_batch, NB, MAX_TOP] float32 their logprobs

    @classmethod
    def allocate(cls, max_batch: int, vocab: int, device: torch.device | str,
                 block_v: int = 2048) -> "LogprobsWorkspace":
        block = max(32, min(block_v, triton.next_power_of_2(vocab)))
        nb = triton.cdiv(vocab, block)
        f32, i32 = dict(dtype=torch.float32, device=device), dict(dtype=torch.int32, device=device)
        return cls(block, torch.empty(max_batch, nb, **f32), torch.empty(max_batch, nb, **f32),
                   torch.empty(max_batch, nb, **i32), torch.empty(max_batch, nb, MAX_TOP, **i32),
                   torch.empty(max_batch, nb, MAX_TOP, **f32))


def logprobs(logits: torch.Tensor, tokens: torch.Tensor, num: torch.Tensor, *,
             workspace: LogprobsWorkspace | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``logprobs_naive`` for the rows with num >= 0 (others are left unwritten). logits [B, V]; tokens [B] and num
    [B] are any integer views (e.g. a column of the sample op's output). Returns int32 [B, COLUMNS]."""
    B, V = logits.shape
    ws = workspace or LogprobsWorkspace.allocate(B, V, logits.device)
    out = torch.empty(B, COLUMNS, dtype=torch.int32, device=logits.device) if out is None else out
    nb = ws.bm.shape[1]
    nb_block = triton.next_power_of_2(nb)
    grid = (B, nb)
    _stats_kernel[grid](logits, num, ws.bm, ws.bs, V, nb, logits.stride(0), num.stride(0), BLOCK=ws.block)
    _select_kernel[grid](logits, num, tokens, ws.bm, ws.bs, ws.count, ws.cand_ids, ws.cand_values, V, nb,
                         logits.stride(0), num.stride(0), tokens.stride(0), BLOCK=ws.block, NB_BLOCK=nb_block)
    _merge_kernel[(B,)](logits, num, tokens, ws.bm, ws.bs, ws.count, ws.cand_ids, ws.cand_values, out,
                        out.view(torch.float32), V, nb, logits.stride(0), num.stride(0), tokens.stride(0),
                        out.stride(0), NB_BLOCK=nb_block, TOP_BLOCK=triton.next_power_of_2(MAX_TOP), num_warps=4)
    return out
