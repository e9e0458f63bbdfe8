"""Steps 1-8 of docs/sampling.md for the rows of a speculative round on the device, in plain torch: every verified
position of every block (p) and every draft position (q), with the penalties seeing the drafts before each position.

These are the sample op's naive steps (``ninfer.fast.ops.sample.naive``: bias, grammar mask, min_tokens, penalties,
temperature, top-k/top-p, min-p) vectorised over the round's rows, with two differences that keep them exact and
cheap: the output counts of row (b, i) are the table's counts plus the drafts d_1..d_i of block b (the host's
``RowContext.at`` history), and a step no row of the call needs (``Steps``, known on the host) is skipped, where the
naive op applies it as an identity. Nothing here reads a device value back, so a CUDA graph can capture it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.fast.ops.sample import layout as L
from ninfer.fast.ops.sample.cutoff import bounded_cutoff
from ninfer.fast.ops.sample.naive import unpack_bits
from ninfer.sampling.filters import apply_temperature, min_p_keep, rank_order, top_k_keep, top_p_keep

from .rows import TOP_K, TOP_K_BOUND, truncation
from .tables import SequenceTables

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Steps:
    """Which steps some row of one call needs (host-known from the rows' parameters)."""

    bias: bool = False
    mask: bool = False
    min_tokens: bool = False
    penalties: bool = False
    random: bool = False  # a row at temperature > 0: steps 5-8 run
    sort: bool = False  # a random row with top-k or top-p
    bounded: bool = False  # with sort: every such row's top-k is in 1..TOP_K_BOUND (no sort of the whole row)
    min_p: bool = False

    @property
    def adjusts(self) -> bool:
        """Whether any of steps 1-4 runs (`adjust` is otherwise the raw logits in fp32; a draft variant's lean form
        is the one without them)."""
        return self.bias or self.mask or self.min_tokens or self.penalties

    @property
    def reads_params(self) -> bool:
        """Whether any step reads the rows' parameters (a lean greedy call draws the argmax of the raw logits)."""
        return self.adjusts or self.random

    @classmethod
    def of(cls, flags: list[int], params: list, masked: bool) -> "Steps":
        random = [p for p in params if not p.is_greedy]
        cut = truncation(random)
        return cls(bias=any(f & L.BIAS for f in flags), mask=masked, min_tokens=any(f & L.MIN_TOKENS for f in flags),
                   penalties=any(f & (L.REPETITION_ON | L.FREQUENCY_ON | L.PRESENCE_ON) for f in flags),
                   random=bool(random), sort=cut is not None, bounded=cut == TOP_K,
                   min_p=any(p.min_p > 0.0 for p in random))


def draft_counts(drafts: torch.Tensor, upto: torch.Tensor, vocab: int) -> torch.Tensor:
    """Per row, how often each token occurs among its first upto[n] drafts: drafts [N, K] long, upto [N] -> int32
    [N, V]. Draft ids past upto may be anything in range."""
    N, K = drafts.shape
    live = (torch.arange(K, device=drafts.device)[None, :] < upto[:, None]).to(torch.int32)  # [N, K]
    return torch.zeros(N, vocab, dtype=torch.int32, device=drafts.device).scatter_add_(1, drafts, live)


def adjust(logits: torch.Tensor, ip: torch.Tensor, fp: torch.Tensor, masks: torch.Tensor | None,
           tables: SequenceTables, steps: Steps, extra_counts: torch.Tensor | None) -> torch.Tensor:
    """Steps 1-4 in float32: logits [N, V], ip/fp [N, NI]/[N, NF] (sample layout), masks [N, W] or None,
    extra_counts [N, V] int32 (the drafts before each row) or None -> [N, V]."""
    if not steps.adjusts:
        return logits.float()  # no step: ip and fp (None in a lean greedy draw) are not read
    V = logits.shape[-1]
    rows, flags = ip[:, L.ROW], ip[:, L.FLAGS]

    def on(bit: int) -> torch.Tensor:
        return (flags & bit != 0)[:, None]  # [N, 1]

    def param(col: int) -> torch.Tensor:
        return fp[:, col].float()[:, None]  # [N, 1], rounded to float32 like the host's scalars

    x = logits.float()
    if steps.bias:
        x = torch.where(on(L.BIAS), x + tables.bias[rows], x)
    if steps.mask:
        x = x.masked_fill(on(L.MASK) & ~unpack_bits(masks, V), NEG_INF)
    if steps.min_tokens:
        x = x.masked_fill(on(L.MIN_TOKENS) & unpack_bits(tables.blocked[rows], V), NEG_INF)
    if not steps.penalties:
        return x
    counts = tables.counts[rows]  # [N, V]
    if extra_counts is not None:
        counts = counts + extra_counts
    seen = (counts > 0) | unpack_bits(tables.prompt_seen[rows], V)
    r = param(L.REPETITION)
    x = torch.where(on(L.REPETITION_ON) & seen, torch.where(x > 0, x / r, x * r), x)
    x = torch.where(on(L.FREQUENCY_ON), x - param(L.FREQUENCY) * counts.float(), x)
    return torch.where(on(L.PRESENCE_ON), x - param(L.PRESENCE) * (counts > 0).float(), x)


def truncated(x: torch.Tensor, ip: torch.Tensor, fp: torch.Tensor, steps: Steps) -> torch.Tensor:
    """Steps 5-8 for random rows, greedy rows passed through (their processed logits are the adjusted ones):
    x [N, V] -> z [N, V], -inf where dropped."""
    if not steps.random:
        return x
    greedy = (ip[:, L.FLAGS] & L.GREEDY != 0)[:, None]  # [N, 1]
    # a greedy row's temperature is 0: divide it by 1 and drop the result below
    z = apply_temperature(x, torch.where(greedy[:, 0], 1.0, fp[:, L.TEMPERATURE]))
    if steps.sort and steps.bounded:
        z = z.masked_fill(~_bounded_keep(z, ip[:, L.TOP_K], fp[:, L.TOP_P]), NEG_INF)
    elif steps.sort:
        order = rank_order(z)  # [N, V]
        z = z.masked_fill(~top_k_keep(order, ip[:, L.TOP_K]), NEG_INF)
        z = z.masked_fill(~top_p_keep(z, order, fp[:, L.TOP_P]), NEG_INF)
    if steps.min_p:
        z = z.masked_fill(~min_p_keep(z, fp[:, L.MIN_P]), NEG_INF)
    return torch.where(greedy, x, z)


def _bounded_keep(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Steps 6-7 from each row's top TOP_K_BOUND values (``bounded_cutoff``): the tokens at or before the cutoff in
    the (z desc, id asc) order, bool [N, V]. A greedy row's result is not used."""
    N, V = z.shape
    tau = torch.empty(N, dtype=torch.float32, device=z.device)
    tid = torch.empty(N, dtype=torch.int64, device=z.device)
    bounded_cutoff(z, top_k, top_p, tau, tid, TOP_K_BOUND)
    ids = torch.arange(V, device=z.device)
    return (z > tau[:, None]) | ((z == tau[:, None]) & (ids <= tid[:, None]))


def drawable(x: torch.Tensor) -> torch.Tensor:
    """Per row of adjusted logits x [N, V], whether a token can be drawn: no NaN or +inf and not every entry -inf,
    the host's checks (`ops/sample/naive.status_naive` is OK). Two launches: the row's maximum is finite exactly
    then (amax propagates a NaN). -> [N] bool"""
    return torch.isfinite(x.amax(-1))
