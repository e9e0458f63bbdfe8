"""A lean greedy draft draw in one launch, where torch takes ten (the row maximum and its finiteness test, argmax,
the draft's column write, the drawable count's comparisons and add): one program per row, over the logits in
blocks, keeping the first NaN, the running maximum and its first index."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl


@triton.jit
def _greedy_draw_kernel(x_ptr, drafts_ptr, num_ptr, room_ptr, j_ptr, token_ptr, V, stride_x, stride_d,
                        BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    b = tl.program_id(0)
    row = x_ptr + b.to(tl.int64) * stride_x
    best = float("-inf")
    arg = 0  # an all -inf row draws id 0, as torch.argmax does
    first_nan = V
    for v0 in range(0, V, BLOCK):
        v = v0 + tl.arange(0, BLOCK)
        live = v < V
        x = tl.load(row + v, mask=live, other=float("-inf")).to(tl.float32)
        nan = x != x
        first_nan = tl.minimum(first_nan, tl.min(tl.where(nan & live, v, V)))
        xs = tl.where(nan, float("-inf"), x)
        top = tl.max(xs)
        at = tl.min(tl.where((xs == top) & live, v, V))  # the block maximum's first index
        ahead = top > best  # an equal maximum later keeps the earlier index
        arg = tl.where(ahead, at, arg)
        best = tl.where(ahead, top, best)
    token = tl.where(first_nan < V, first_nan, arg).to(tl.int64)
    ok = (first_nan >= V) & (best < float("inf")) & (best > float("-inf"))
    j = tl.load(j_ptr)
    tl.store(drafts_ptr + b.to(tl.int64) * stride_d + j, token)
    n = tl.load(num_ptr + b)
    tl.store(num_ptr + b, n + (ok & (n == j) & (j < tl.load(room_ptr + b))).to(tl.int32))
    tl.store(token_ptr + b, token)


def greedy_draw(logits: torch.Tensor, drafts: torch.Tensor, num: torch.Tensor, room: torch.Tensor,
                j: torch.Tensor) -> torch.Tensor:
    """Same contract as ``greedy_draw_naive``; logits rows contiguous, drafts' rows contiguous."""
    B, V = logits.shape
    assert logits.stride(1) == 1 and drafts.stride(1) == 1 and drafts.dtype == torch.int64
    token = torch.empty(B, dtype=torch.int64, device=logits.device)
    on = pdl.active(logits)
    _greedy_draw_kernel[(B,)](logits, drafts, num, room, j, token, V, logits.stride(0), drafts.stride(0),
                              BLOCK=min(4096, triton.next_power_of_2(V)), PDL=on, **pdl.launch(on))
    return token
