"""DFlash2's greedy candidate-selector walk in one launch: one program per row walks the block's k slots, the
predecessor a register between them, each slot's K candidates scored as ``dflash_select`` does (successor rows and
the predecessor row gathered by token id, the rank reduction in fp32) and the first maximum taken as the slot's draft
(ties to the lowest id, a NaN before any number, 0 when every score is -inf: what argmax over the slot's scattered
[V] row returns). Replaces k rounds of [R, V] scatter, adjust, drawable test and argmax launches."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dflash_walk_kernel(u_ptr, c_ptr, p_ptr, a0_ptr, a_ptr, b_ptr, room_ptr, d_ptr, n_ptr, KD, K, R, V,
                        stride_ur, stride_uj, stride_cr, stride_cj, stride_pr, stride_pj, stride_a, stride_b,
                        stride_d, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    rs = tl.arange(0, BLOCK_R)
    kmask, rmask = ks < K, rs < R
    room = tl.load(room_ptr + row)
    prev = tl.load(a0_ptr + row).to(tl.int64)
    num = room * 0
    for j in range(KD):
        ctx = tl.load(a_ptr + prev * stride_a + rs, mask=rmask, other=0.0).to(tl.float32) * \
            tl.load(p_ptr + row * stride_pr + j * stride_pj + rs, mask=rmask, other=0.0).to(tl.float32)  # [BLOCK_R]
        cand = tl.load(c_ptr + row * stride_cr + j * stride_cj + ks, mask=kmask, other=0).to(tl.int64)  # [BLOCK_K]
        succ = tl.load(b_ptr + cand[:, None] * stride_b + rs[None, :], mask=kmask[:, None] & rmask[None, :],
                       other=0.0).to(tl.float32)  # [BLOCK_K, BLOCK_R]
        unary = tl.load(u_ptr + row * stride_ur + j * stride_uj + ks, mask=kmask, other=0.0).to(tl.float32)
        s = unary + tl.sum(succ * ctx[None, :], axis=1)  # [BLOCK_K]
        nan = (s != s) & kmask
        best = tl.max(tl.where(kmask & ~nan, s, float("-inf")), axis=0)
        any_nan = tl.max(nan.to(tl.int32), axis=0) > 0
        # the lowest id among the NaNs, else among the maxima; argmax over the all -inf row is id 0
        tie = tl.where(any_nan, nan, kmask & (s == best))
        first = tl.min(tl.where(tie, cand, V), axis=0)
        token = tl.where(~any_nan & (best == float("-inf")), 0, first)
        ok = ~any_nan & (best != float("inf")) & (best != float("-inf"))
        tl.store(d_ptr + row * stride_d + j, token)
        num += (ok & (num == j) & (j < room)).to(tl.int32)
        prev = token
    tl.store(n_ptr + row, num)


def dflash_walk(unary: torch.Tensor, cand: torch.Tensor, proj: torch.Tensor, anchor: torch.Tensor,
                pred: torch.Tensor, succ: torch.Tensor, room: torch.Tensor, drafts: torch.Tensor | None = None,
                num: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """unary [R, k, K], cand [R, k, K] token ids, proj [R, k, r], anchor [R], pred/succ [V, r], room [R] int32 ->
    (drafts [R, k] long, num [R] int32), written into `drafts` / `num` when given (graph buffers)."""
    R, k, K = unary.shape
    r, V = proj.shape[-1], pred.shape[0]
    assert cand.shape == (R, k, K) and proj.shape[:2] == (R, k) and anchor.shape == room.shape == (R,)
    assert pred.shape[1] == succ.shape[1] == r and unary.stride(2) == cand.stride(2) == proj.stride(2) == 1
    assert pred.stride(1) == succ.stride(1) == 1 and room.dtype == torch.int32
    drafts = torch.empty(R, k, dtype=torch.long, device=unary.device) if drafts is None else drafts
    num = torch.empty(R, dtype=torch.int32, device=unary.device) if num is None else num
    assert drafts.shape == (R, k) and drafts.stride(1) == 1 and num.shape == (R,)
    _dflash_walk_kernel[(R,)](unary, cand, proj, anchor, pred, succ, room, drafts, num, k, K, r, V,
                              unary.stride(0), unary.stride(1), cand.stride(0), cand.stride(1), proj.stride(0),
                              proj.stride(1), pred.stride(0), succ.stride(0), drafts.stride(0),
                              BLOCK_K=triton.next_power_of_2(K), BLOCK_R=triton.next_power_of_2(r))
    return drafts, num
