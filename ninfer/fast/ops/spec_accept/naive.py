"""The spec_accept op's definition on device tensors, in plain torch: ``ninfer.sampling.accept`` (the host's lossless
acceptance, docs/speculative.md) vectorised over rows and verified positions, built from the host's own Philox
functions. Every position's outcome is computed at once (its accept test, its residual draw, its bonus draw) and the
walk is a cumulative product, so it reads no device value back (no host sync)."""

from __future__ import annotations

import torch

from ninfer.sampling.philox import (STREAM_ACCEPT, STREAM_RESIDUAL, STREAM_TOKEN, draw_bits_torch, gumbel_noise,
                                    uniform_from_bits_torch)

from .layout import ALL_MASKED, BAD_LOGITS, FLAGS, GREEDY, NO_TOKEN, OK, POSITION, SEED


def _keyed(iparams: torch.Tensor, K1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeds and absolute positions of every verified row, flattened [B * K1]."""
    seeds = iparams[:, SEED].repeat_interleave(K1)
    offs = torch.arange(K1, device=iparams.device).repeat(iparams.shape[0])
    return seeds, iparams[:, POSITION].repeat_interleave(K1) + offs


def _race(scores: torch.Tensor, iparams: torch.Tensor, stream: int) -> torch.Tensor:
    """argmax(scores + Gumbel noise of `stream`) per verified row, float64, lowest id on ties. [B, K1, V] -> [B, K1]"""
    B, K1, V = scores.shape
    seeds, positions = _keyed(iparams, K1)
    noise = gumbel_noise(seeds, positions, V, stream).view(B, K1, V)
    return torch.argmax(scores.double() + noise.double(), dim=-1)


def _status(z: torch.Tensor) -> torch.Tensor:
    """Per verified row: BAD_LOGITS (NaN/+inf) before ALL_MASKED, as the host checks. [B, K1, V] -> [B, K1]"""
    bad = (torch.isnan(z) | torch.isposinf(z)).any(-1)
    empty = torch.isneginf(z).all(-1)
    return torch.where(bad, BAD_LOGITS, torch.where(empty, ALL_MASKED, OK))


def spec_accept_naive(target: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor, iparams: torch.Tensor,
                      draft_logits: torch.Tensor | None = None) -> torch.Tensor:
    """Accept a prefix of each row's drafts. target [B, k+1, V] float32: the processed target logits of each verified
    row (``processed_logits``: every filter, mask and penalty applied, -inf where dropped; p = softmax); drafts
    [B, k] int; num_drafts [B] (k' <= k drafts are real, the rest is ignored); iparams [B, >= 5] int64 (sample layout);
    draft_logits [B, k, V] float32: the processed draft logits (q = softmax; a one-hot q is 0 at the draft and -inf
    elsewhere), read by random rows only, None when every row is greedy. -> int32 [B, 2 + k + 1] (layout.py)."""
    B, K1, V = target.shape
    K = K1 - 1
    z = target.float()
    greedy = (iparams[:, FLAGS] & GREEDY != 0)[:, None]  # [B, 1]
    top = torch.argmax(z, dim=-1)  # [B, K1], lowest id on ties
    live = torch.arange(K, device=z.device)[None, :] < num_drafts.long()[:, None]  # [B, K]
    d = torch.where(live, drafts.long(), 0)[:, :, None]  # [B, K, 1]; ids past a row's drafts may be junk
    accepted = top[:, :K] == d[..., 0]  # greedy: the draft is the argmax
    rejected_token = top[:, :K]
    bonus = top
    if draft_logits is not None:
        p = torch.softmax(z.double(), dim=-1)  # [B, K1, V]
        q = torch.softmax(draft_logits.float().double(), dim=-1)  # [B, K, V]
        seeds, positions = _keyed(iparams, K1)
        u = uniform_from_bits_torch(draw_bits_torch(seeds, positions, 1, STREAM_ACCEPT)).view(B, K1)[:, :K]
        sampled = u.double() * q.gather(-1, d)[..., 0] < p[:, :K].gather(-1, d)[..., 0]  # [B, K]
        accepted = torch.where(greedy, accepted, sampled)
        residual = torch.log(torch.clamp(p[:, :K] - q, min=0.0))  # [B, K, V]
        residual = torch.cat([residual, residual.new_zeros(B, 1, V)], dim=1)  # position k has no residual
        rejected_token = torch.where(greedy, rejected_token, _race(residual, iparams, STREAM_RESIDUAL)[:, :K])
        bonus = torch.where(greedy, top, _race(z, iparams, STREAM_TOKEN))
    accepted &= live
    reached = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=z.device),
                         torch.cumprod(accepted.int(), dim=1).bool()], dim=1)  # [B, K1]: all drafts before accepted
    j = reached.sum(-1) - 1  # [B] accepted drafts
    status = _status(z).masked_fill(~reached, OK)
    first_bad = torch.argmax((status != OK).int(), dim=-1, keepdim=True)  # the first reached row that failed
    pos = torch.arange(K1, device=z.device)[None, :]  # [1, K1]
    at_j = torch.where(j[:, None] < num_drafts.long()[:, None], _pad(rejected_token, V), bonus)  # [B, K1]
    tokens = torch.where(pos < j[:, None], _pad(drafts.long(), V), at_j)
    tokens = torch.where(pos <= j[:, None], tokens, NO_TOKEN)
    head = torch.stack([j + 1, status.gather(1, first_bad)[:, 0]], dim=-1)
    return torch.cat([head, tokens], dim=-1).to(torch.int32)


def _pad(x: torch.Tensor, fill: int) -> torch.Tensor:
    """[B, k] -> [B, k + 1] with `fill` in the last column (position k is never a rejected or a draft token)."""
    return torch.cat([x, x.new_full((x.shape[0], 1), fill)], dim=1)
