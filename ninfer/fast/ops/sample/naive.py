"""The sample op's definition on device tensors, in plain torch: steps 1-9 of docs/sampling.md for a batch of rows
with per-row parameters, built from the host sampler's own filter and RNG functions (``ninfer.sampling``), so it
is the host definition vectorised over rows. It reads no device value back (no host sync) and always runs every
step; the Triton launcher skips the steps no row needs."""

from __future__ import annotations

import torch

from ninfer.sampling.filters import apply_temperature, min_p_keep, rank_order, top_k_keep, top_p_keep
from ninfer.sampling.philox import gumbel_noise

from .layout import (ALL_MASKED, BAD_LOGITS, BIAS, FLAGS, FREQUENCY, FREQUENCY_ON, GREEDY, MASK, MIN_P, MIN_TOKENS,
                     OK, POSITION, PRESENCE, PRESENCE_ON, REPETITION, REPETITION_ON, ROW, SEED, TEMPERATURE, TOP_K,
                     TOP_P, SampleInputs)

NEG_INF = float("-inf")


def unpack_bits(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 bitmask rows [N, W] -> bool [N, V] (bit t % 32 of word t // 32)."""
    t = torch.arange(vocab, device=words.device)
    # int32 >> is arithmetic, but only bit 0 of the shifted word is kept
    return ((words.long().index_select(1, t // 32) >> (t % 32)) & 1).bool()  # [N, V]


def adjust_naive(logits: torch.Tensor, inp: SampleInputs) -> torch.Tensor:
    """Steps 1-4 (bias, grammar mask, min_tokens, penalties) in float32. logits [B, V] -> [B, V]."""
    vocab = logits.shape[-1]
    rows, flags = inp.iparams[:, ROW], inp.iparams[:, FLAGS]

    def on(bit: int) -> torch.Tensor:
        return (flags & bit != 0)[:, None]  # [B, 1]

    def param(col: int) -> torch.Tensor:
        return inp.fparams[:, col].float()[:, None]  # [B, 1], rounded to float32 like the host's scalars

    x = logits.float()
    x = torch.where(on(BIAS), x + inp.bias[rows], x)
    x = x.masked_fill(on(MASK) & ~unpack_bits(inp.masks, vocab), NEG_INF)
    x = x.masked_fill(on(MIN_TOKENS) & unpack_bits(inp.blocked[rows], vocab), NEG_INF)
    counts = inp.counts[rows]  # [B, V]
    seen = (counts > 0) | unpack_bits(inp.prompt_seen[rows], vocab)
    r = param(REPETITION)
    x = torch.where(on(REPETITION_ON) & seen, torch.where(x > 0, x / r, x * r), x)
    x = torch.where(on(FREQUENCY_ON), x - param(FREQUENCY) * counts.float(), x)
    return torch.where(on(PRESENCE_ON), x - param(PRESENCE) * (counts > 0).float(), x)


def status_naive(x: torch.Tensor) -> torch.Tensor:
    """Per-row status of adjusted logits [B, V]: BAD_LOGITS (NaN/+inf) before ALL_MASKED, as the host checks."""
    bad = (torch.isnan(x) | torch.isposinf(x)).any(-1)
    empty = torch.isneginf(x).all(-1)
    return torch.where(bad, BAD_LOGITS, torch.where(empty, ALL_MASKED, OK)).to(torch.int32)  # [B]


def truncate_naive(x: torch.Tensor, inp: SampleInputs) -> torch.Tensor:
    """Steps 5-8 (temperature, top-k, top-p, min-p) with the host's own filters: z [B, V], -inf where dropped."""
    z = apply_temperature(x, inp.fparams[:, TEMPERATURE])
    order = rank_order(z)  # [B, V]
    z = z.masked_fill(~top_k_keep(order, inp.iparams[:, TOP_K]), NEG_INF)
    z = z.masked_fill(~top_p_keep(z, order, inp.fparams[:, TOP_P]), NEG_INF)
    return z.masked_fill(~min_p_keep(z, inp.fparams[:, MIN_P]), NEG_INF)


def sample_naive(logits: torch.Tensor, inp: SampleInputs) -> torch.Tensor:
    """One token per row. logits [B, V] (read as float32) -> int32 [B, 2]: (token, status).

    Greedy rows take the argmax of the adjusted logits, the others the Gumbel race over the truncated ones; both
    break ties to the lowest id (torch.argmax returns the first maximum). A row whose status is not OK has an
    unspecified token."""
    x = adjust_naive(logits, inp)  # [B, V]
    greedy = inp.iparams[:, FLAGS] & GREEDY != 0  # [B]
    z = truncate_naive(x, inp)
    noise = gumbel_noise(inp.iparams[:, SEED], inp.iparams[:, POSITION], x.shape[-1])  # [B, V] float32
    race = torch.argmax(z.double() + noise.double(), dim=-1)
    token = torch.where(greedy, torch.argmax(x, dim=-1), race)
    return torch.stack([token.to(torch.int32), status_naive(x)], dim=-1)  # [B, 2]
