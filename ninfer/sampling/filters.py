"""Steps 5-8 of the sampling pipeline on a batch of rows: temperature, top-k, top-p, min-p.

Every function takes per-row parameters as tensors so that one call serves a batch of mixed
requests; the single-row sampler calls the same functions with B = 1, so there is exactly one
definition of each filter. Filters return keep-masks over the temperature-scaled logits z; they
never renormalise anything, because the exponential race only needs relative weights.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def apply_temperature(x: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """z = x / T in float32 (IEEE division, correctly rounded). x [B, V], temperature [B]."""
    t = temperature.to(device=x.device, dtype=torch.float32).reshape(-1, 1)  # [B, 1]
    return x / t  # [B, V]


def rank_order(z: torch.Tensor) -> torch.Tensor:
    """Token ids of each row sorted by (z descending, id ascending). z [B, V] -> [B, V] int64."""
    # a stable descending sort keeps equal values in ascending id order
    return torch.sort(z, dim=-1, descending=True, stable=True).indices


def top_k_keep(order: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep exactly the first k tokens of ``order`` (ties at the k-th value go to lower ids).

    order [B, V] from ``rank_order``; top_k [B] with 0 meaning off. Returns bool [B, V].
    """
    vocab = order.shape[-1]
    k = top_k.to(device=order.device, dtype=torch.int64).reshape(-1, 1)  # [B, 1]
    k = torch.where(k > 0, k, vocab)
    rank_keep = torch.arange(vocab, device=order.device).reshape(1, -1) < k  # [B, V] by rank
    return torch.zeros_like(rank_keep).scatter(1, order, rank_keep)


def softmax64(z: torch.Tensor) -> torch.Tensor:
    """softmax(z) over the last axis in float64, as exp(z - max) / sum: the same formula as ``torch.softmax``, in
    ops that spread one long row over the device (CUDA's softmax kernel gives a row one thread block: a draft's
    [1, 248320] row took 0.27 ms on an H100, 4.0 ms of a DFlash2 sampled draft's 11.3, seventeenth session's
    profile). A row without a finite maximum gives NaN, as torch.softmax does."""
    z64 = z.to(torch.float64)
    e = torch.exp(z64 - z64.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def top_p_keep(z: torch.Tensor, order: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the minimal nucleus: the shortest prefix of ``order`` whose probability reaches top_p.

    Probabilities are softmax(z) in float64. A token at rank j is kept when the mass of the
    tokens ranked before it is < top_p, so the token that crosses top_p is kept and rank 0 always
    is. top_p [B]; rows with top_p >= 1 keep everything. Returns bool [B, V].
    """
    p = softmax64(z).gather(1, order)  # [B, V] by rank
    # mass ranked strictly before each token: the inclusive sum shifted right by one, which
    # avoids the rounding of subtracting p from the inclusive sum
    before = torch.nn.functional.pad(torch.cumsum(p, dim=-1)[:, :-1], (1, 0))  # [B, V]
    limit = top_p.to(device=z.device, dtype=torch.float64).reshape(-1, 1)  # [B, 1]
    rank_keep = (before < limit) | (limit >= 1.0)
    return torch.zeros_like(rank_keep).scatter(1, order, rank_keep)


def min_p_keep(z: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Keep tokens with p_t >= min_p * p_max, i.e. exp(z_t - z_max) >= min_p in float64.

    The ratio form needs no normalisation, so it is the same whether computed before or after
    the top-k/top-p truncation that keeps the most likely token. min_p [B]; 0 is off.
    """
    z64 = z.to(torch.float64)  # [B, V]
    ratio = torch.exp(z64 - z64.max(dim=-1, keepdim=True).values)  # [B, V] in [0, 1]
    limit = min_p.to(device=z.device, dtype=torch.float64).reshape(-1, 1)  # [B, 1]
    return (ratio >= limit) | (limit <= 0.0)


def truncate(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
             min_p: torch.Tensor) -> torch.Tensor:
    """Steps 6-8 in order: top-k, then top-p over the top-k survivors, then min-p.

    z [B, V] float32 (temperature applied); returns z with dropped tokens set to -inf.
    """
    if bool((top_k > 0).any()) or bool((top_p < 1.0).any()):
        # one sort serves both: top-k keeps a prefix of the order, so the survivors stay sorted
        order = rank_order(z)  # [B, V]
        z = z.masked_fill(~top_k_keep(order, top_k), NEG_INF)
        z = z.masked_fill(~top_p_keep(z, order, top_p), NEG_INF)
    if bool((min_p > 0.0).any()):
        z = z.masked_fill(~min_p_keep(z, min_p), NEG_INF)
    return z
