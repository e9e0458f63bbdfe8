"""One step of DFlash2's candidate-selector walk: one program per row, the K candidates' successor rows and the
predecessor row gathered by token id, the rank reduction in fp32."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dflash_select_kernel(u_ptr, c_ptr, p_ptr, prev_ptr, a_ptr, b_ptr, o_ptr, K, R, stride_u, stride_c, stride_p,
                          stride_a, stride_b, stride_o, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    rs = tl.arange(0, BLOCK_R)
    kmask, rmask = ks < K, rs < R
    prev = tl.load(prev_ptr + row).to(tl.int64)
    ctx = tl.load(a_ptr + prev * stride_a + rs, mask=rmask, other=0.0).to(tl.float32) * \
        tl.load(p_ptr + row * stride_p + rs, mask=rmask, other=0.0).to(tl.float32)  # [BLOCK_R]
    cand = tl.load(c_ptr + row * stride_c + ks, mask=kmask, other=0).to(tl.int64)  # [BLOCK_K]
    succ = tl.load(b_ptr + cand[:, None] * stride_b + rs[None, :], mask=kmask[:, None] & rmask[None, :],
                   other=0.0).to(tl.float32)  # [BLOCK_K, BLOCK_R]
    unary = tl.load(u_ptr + row * stride_u + ks, mask=kmask, other=0.0).to(tl.float32)
    tl.store(o_ptr + row * stride_o + ks, unary + tl.sum(succ * ctx[None, :], axis=1), mask=kmask)


def dflash_select(unary: torch.Tensor, cand: torch.Tensor, proj: torch.Tensor, prev: torch.Tensor,
                  pred: torch.Tensor, succ: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """unary [R, K], cand [R, K] token ids, proj [R, r], prev [R] token ids, pred/succ [V, r] -> fp32 [R, K]."""
    rows, K = unary.shape
    r = proj.shape[1]
    assert cand.shape == (rows, K) and prev.shape == (rows,) and pred.shape[1] == succ.shape[1] == r
    assert unary.stride(1) == cand.stride(1) == proj.stride(1) == pred.stride(1) == succ.stride(1) == 1
    out = torch.empty(rows, K, dtype=torch.float32, device=unary.device) if out is None else out
    _dflash_select_kernel[(rows,)](unary, cand, proj, prev, pred, succ, out, K, r, unary.stride(0), cand.stride(0),
                                   proj.stride(0), pred.stride(0), succ.stride(0), out.stride(0),
                                   BLOCK_K=triton.next_power_of_2(K), BLOCK_R=triton.next_power_of_2(r))
    return out
