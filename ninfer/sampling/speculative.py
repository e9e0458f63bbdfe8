"""Speculative sampling: draw a draft token from the draft distribution q, and accept a block of drafts against
the target distribution p, lossless at any temperature (docs/speculative.md).

Every random number comes from the counter-based generator keyed by (seed, absolute position, purpose)
(`philox.STREAM_*`), so a replay, a rollback and the other Program all see the same uniforms. p at each position
is the distribution the ordinary draw samples from (`processed_logits`: bias, grammar mask of that draft prefix,
min_tokens, penalties over the history including the earlier drafts, temperature, truncation), so greedy rows
accept exactly the autoregressive argmax and random rows reproduce p in distribution:

    draft d ~ q;  accept when u * q(d) < p(d), u ~ U(0, 1);  otherwise draw from (p - q)+ and end the block;
    after k accepted drafts the bonus token is the ordinary draw from p at the next position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ninfer.sampling.logprobs import token_logprobs
from ninfer.sampling.params import SamplingParams
from ninfer.sampling.philox import (STREAM_ACCEPT, STREAM_DRAFT, STREAM_RESIDUAL, STREAM_TOKEN, draw_bits_torch,
                                    gumbel_noise, seed_tensor, uniform_from_bits_torch)
from ninfer.sampling.sampler import RowSampling, processed_logits


def draft_vocabulary(logits: torch.Tensor, size: int | None) -> torch.Tensor:
    """Draft logits [..., V] with the ids at and past `size` at -inf (a copy; None: unchanged): the draft vocabulary
    of ``draft_vocab_size``, where drafts and q have no support."""
    if size is None:
        return logits
    out = logits.clone()
    out[..., size:] = float("-inf")
    return out


@dataclass(frozen=True)
class RowContext:
    """What one row's draws depend on besides logits and position."""

    params: SamplingParams
    seed: int
    prompt: Sequence[int]
    outputs: Sequence[int]  # committed outputs, the pending token included
    eos_token_ids: tuple[int, ...]

    def at(self, position: int, drafts: Sequence[int], mask: Any | None) -> RowSampling:
        """The ordinary draw's row at `position`, with the drafts before it in the history."""
        return RowSampling(self.params, self.seed, position, prompt_token_ids=self.prompt,
                           output_token_ids=list(self.outputs) + list(drafts), eos_token_ids=self.eos_token_ids,
                           allowed=mask)


@dataclass(frozen=True)
class Accepted:
    tokens: tuple[int, ...]  # accepted drafts, then the bonus (or residual) token
    logprobs: tuple[tuple[float, tuple], ...] | None  # per token, of the target's raw distribution


def _race(z: torch.Tensor, seed: int, position: int, stream: int) -> int:
    """argmax(z + Gumbel noise) of one row z [V] (lowest id on ties), noise keyed by (seed, position, stream)."""
    noise = gumbel_noise(seed_tensor([seed]), torch.tensor([position]), z.shape[-1], stream)[0]  # [V]
    return int(torch.argmax(z.to(torch.float64) + noise.to(torch.float64)))


def _uniform(seed: int, position: int) -> float:
    bits = draw_bits_torch(seed_tensor([seed]), torch.tensor([position]), 1, STREAM_ACCEPT)  # [1, 1]
    return float(uniform_from_bits_torch(bits)[0, 0])


def draw_draft(logits: torch.Tensor, ctx: RowContext, position: int, drafts: Sequence[int]
               ) -> tuple[int, torch.Tensor | None]:
    """The draft token at `position` from the backend's logits [V] and q as float64 probabilities [V] (None for a
    greedy row, whose acceptance needs no q). q is processed like p (no grammar mask: lossless for any q)."""
    z = processed_logits(logits.to(torch.float32), ctx.at(position, drafts, None))  # [V]
    if ctx.params.is_greedy:
        return int(torch.argmax(z)), None
    return _race(z, ctx.seed, position, STREAM_DRAFT), torch.softmax(z.to(torch.float64), dim=-1)


def accept(target: torch.Tensor, drafts: Sequence[int], q: Sequence[torch.Tensor | None], ctx: RowContext,
           base: int, masks: Sequence[Any | None]) -> Accepted:
    """Accept a prefix of `drafts` (positions base..) against the target's fp32 logits [len(drafts) + 1, V]
    (row i: the distribution at base + i given the drafts before it); masks[i] constrains row i."""
    greedy = ctx.params.is_greedy
    out: list[int] = []
    for i in range(len(drafts) + 1):
        pos = base + i
        z = processed_logits(target[i], ctx.at(pos, drafts[:i], masks[i]))  # [V]
        if i == len(drafts):  # every draft accepted: the bonus is the ordinary draw
            out.append(int(torch.argmax(z)) if greedy else _race(z, ctx.seed, pos, STREAM_TOKEN))
            break
        d = drafts[i]
        if greedy:
            top = int(torch.argmax(z))
            out.append(top)
            if top != d:
                break
            continue
        p = torch.softmax(z.to(torch.float64), dim=-1)  # [V]
        if _uniform(ctx.seed, pos) * float(q[i][d]) < float(p[d]):
            out.append(d)
            continue
        residual = torch.clamp(p - q[i], min=0.0)  # [V], non-zero somewhere: q(d) > p(d) here
        out.append(_race(torch.log(residual), ctx.seed, pos, STREAM_RESIDUAL))
        break
    lps = None
    if ctx.params.logprobs is not None:
        lps = tuple((lp.logprob, lp.top) for lp in
                    (token_logprobs(target[i], t, ctx.params.logprobs) for i, t in enumerate(out)))
    return Accepted(tuple(out), lps)
