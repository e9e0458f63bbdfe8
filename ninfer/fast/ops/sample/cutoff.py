"""Steps 6-7 (top-k, then top-p) of docs/sampling.md as a cutoff in the (z descending, id ascending) order: a row
keeps token t iff (z_t, -t) >= (tau, -tid), which is a prefix of the host's ``rank_order`` (``ninfer.sampling.
filters``). Two ways to the same cutoff, in torch (no host read, so a CUDA graph captures them):

- ``truncation_cutoff``: one stable sort of the whole row (any top-k, any top-p);
- ``bounded_cutoff``: only the row's top ``bound`` values (``torch.topk``), valid when every row's top-k is in
  1..bound or the row has neither filter. Qwen3.5's released sampling defaults are top-k 20 with top-p 0.95, so a
  draw at the defaults needs no sort of the 248,320-token vocabulary. Tied values at the cutoff are resolved by id
  exactly as the stable sort orders them (the lowest ids first), from the count of ties below each id.

The kept ranks are those below k whose float64 mass ranked before them is < top_p; a parallel prefix sum that rounds
differently from the host's can move the cutoff only at a boundary tie.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _kept_ranks(ranked: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """How many of the descending values ranked [B, R] a row keeps ([B] long, >= 1): the first k, then the shortest
    prefix whose mass reaches top_p (mass over the top-k, float64)."""
    R = ranked.shape[-1]
    rank = torch.arange(R, device=ranked.device)
    in_k = rank < torch.where(top_k > 0, top_k, R)[:, None]  # [B, R]
    p = torch.softmax(ranked.masked_fill(~in_k, float("-inf")).double(), dim=-1)  # [B, R]
    before = F.pad(torch.cumsum(p, dim=-1)[:, :-1], (1, 0))  # mass ranked strictly before, as the host shifts it
    limit = top_p[:, None]
    keep = in_k & ((before < limit) | (limit >= 1.0))
    return torch.where(keep.all(-1), R, (~keep).to(torch.int32).argmax(-1)).clamp(min=1)


def truncation_cutoff(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, tau: torch.Tensor,
                      tid: torch.Tensor) -> None:
    """The cutoff of z [B, V] from a stable sort, into tau [B] float32 and tid [B] int64; rows with neither filter
    keep everything (tau -inf, tid V). top_k [B] (0 off); top_p [B] float64 (1 off)."""
    V = z.shape[-1]
    sorted_z, order = torch.sort(z, dim=-1, descending=True, stable=True)  # [B, V]
    last = (_kept_ranks(sorted_z, top_k, top_p) - 1)[:, None]
    off = (top_k <= 0) & (top_p >= 1.0)
    tau.copy_(torch.where(off, float("-inf"), sorted_z.gather(1, last)[:, 0]))
    tid.copy_(torch.where(off, V, order.gather(1, last)[:, 0]))


def bounded_cutoff(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, tau: torch.Tensor, tid: torch.Tensor,
                   bound: int) -> None:
    """``truncation_cutoff`` for rows whose top-k is in 1..bound (or that have neither filter: they keep
    everything) from the row's top min(bound, V) values. A row with top-k 0 and top-p < 1 is outside its domain (its
    nucleus may reach past the bound): the caller routes such a batch to ``truncation_cutoff``."""
    V = z.shape[-1]
    top = torch.topk(z, min(bound, V), dim=-1, sorted=True).values  # [B, K] descending
    n = _kept_ranks(top, top_k, top_p)  # [B] (a row with top-k 0 reads as k = K: only "off" rows have it)
    value = top.gather(1, (n - 1)[:, None])  # [B, 1]: the last kept value
    # the last kept token is the (n - above)-th lowest id among the tokens tied at that value
    above = (z > value).sum(-1, keepdim=True)  # [B, 1]
    tied = z == value  # [B, V]
    nth = tied & (torch.cumsum(tied.to(torch.int32), dim=-1) == n[:, None] - above)
    off = (top_k <= 0) & (top_p >= 1.0)
    tau.copy_(torch.where(off, float("-inf"), value[:, 0]))
    tid.copy_(torch.where(off, V, nth.to(torch.int32).argmax(-1)))
