"""gumbel_race over vocabulary blocks: two launches for what the naive op spends 283 small kernels on (the CPU
launch counter; its torch Philox splits every 32-bit multiply into 16-bit halves, ten rounds over [B, V]).

  _block_kernel  grid (B, NB): score = z + g in float64 over one block of the vocabulary, g from the sample op's
                 Philox (``_gumbel``, bit-equal to the host's); the block's max and its lowest id at that max
  _winner_kernel grid (B,):    the lowest id among the blocks holding the row's max (blocks are in id order)

Nothing is read back, so a CUDA graph captures it (the draft graphs' draws). A row whose z holds NaN gets an
unspecified but valid id: its caller reports the row's status from z, not from the token.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ninfer.fast.ops.sample.triton import _gumbel

_NO_ID = tl.constexpr(2 ** 31 - 1)  # larger than any token id: loses every lowest-id tie-break


@triton.jit
def _block_kernel(z_ptr, seed_ptr, pos_ptr, smax_ptr, sarg_ptr, V, NB, stride_z, STREAM: tl.constexpr,
                  BLOCK: tl.constexpr):
    b = tl.program_id(0)
    blk = tl.program_id(1)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    inb = offs < V
    z = tl.load(z_ptr + b * stride_z + offs, mask=inb, other=float("-inf")).to(tl.float32)
    g = _gumbel(tl.load(seed_ptr + b), tl.load(pos_ptr + b), offs, STREAM)
    score = tl.where(inb, z.to(tl.float64) + g.to(tl.float64), float("-inf"))
    best = tl.max(score, 0)
    tl.store(smax_ptr + b * NB + blk, best)
    tl.store(sarg_ptr + b * NB + blk, tl.min(tl.where(score == best, offs, _NO_ID), 0))


@triton.jit
def _winner_kernel(smax_ptr, sarg_ptr, out_ptr, V, NB, NB_BLOCK: tl.constexpr):
    b = tl.program_id(0)
    nb = tl.arange(0, NB_BLOCK)
    m = nb < NB
    s = tl.load(smax_ptr + b * NB + nb, mask=m, other=float("-inf"))
    token = tl.min(tl.where(s == tl.max(s, 0), tl.load(sarg_ptr + b * NB + nb, mask=m, other=_NO_ID), _NO_ID), 0)
    tl.store(out_ptr + b, tl.minimum(token, V - 1).to(tl.int64))


class RaceWorkspace(NamedTuple):
    """Each (row, block)'s max score [M, NB] float64 and its lowest id there [M, NB] int32, for up to M rows."""

    smax: torch.Tensor
    sarg: torch.Tensor

    @classmethod
    def allocate(cls, max_batch: int, vocab: int, block: int, device) -> "RaceWorkspace":
        nb = triton.cdiv(vocab, block)
        return cls(torch.empty(max_batch, nb, dtype=torch.float64, device=device),
                   torch.empty(max_batch, nb, dtype=torch.int32, device=device))


def gumbel_race(z: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, stream: int, block: int = 2048,
                out: torch.Tensor | None = None, workspace: RaceWorkspace | None = None) -> torch.Tensor:
    """``gumbel_race_naive`` in two launches. z [B, V] float32 (row stride free, unit column stride), seeds /
    positions [B] int64 -> tokens [B] int64 (into ``out`` when given; the workspace is allocated when not given)."""
    B, V = z.shape
    assert z.stride(1) == 1, "z rows must be contiguous"
    nb = triton.cdiv(V, block)
    smax, sarg = workspace or RaceWorkspace.allocate(B, V, block, z.device)
    assert smax.shape[0] >= B and smax.shape[1] == nb, f"workspace {tuple(smax.shape)} for {B} rows of {nb} blocks"
    out = torch.empty(B, dtype=torch.int64, device=z.device) if out is None else out
    opts = dict(num_warps=8 if block >= 2048 else 4, enable_fp_fusion=False)
    _block_kernel[(B, nb)](z, seeds.contiguous(), positions.contiguous(), smax, sarg, V, nb, z.stride(0),
                           STREAM=stream, BLOCK=block, **opts)
    _winner_kernel[(B,)](smax, sarg, out, V, nb, NB_BLOCK=triton.next_power_of_2(nb), num_warps=1)
    return out
