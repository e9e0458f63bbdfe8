"""Log-probabilities reported with a sampled token.

By default they are of the raw model distribution, log_softmax(logits) before any bias, mask,
penalty, temperature or truncation: what OpenAI returns and vLLM's default ``raw_logprobs`` mode.
Passing ``processed_logits(...)`` as the row instead gives the distribution the token was actually
drawn from (vLLM's ``processed_logprobs``), with -inf for dropped tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    # 1 + the number of tokens strictly more likely than the chosen one (vLLM's rank)
    rank: int
    # the num_top most likely (token_id, logprob), most likely first, ties to the lower id
    top: tuple[tuple[int, float], ...]


def top_logprobs(logprobs: torch.Tensor, num_top: int) -> tuple[tuple[int, float], ...]:
    """The num_top largest entries of a logprob row [V], ordered by (logprob desc, id asc)."""
    if num_top <= 0:
        return ()
    num_top = min(num_top, logprobs.shape[-1])
    threshold = torch.topk(logprobs, num_top).values[-1]
    # all tokens above the num_top-th value, then the lowest-id tokens tied with it, so the id
    # tie-break is exact however many ties (e.g. -inf after truncation) there are
    above = torch.nonzero(logprobs > threshold).reshape(-1)
    tied = torch.nonzero(logprobs == threshold).reshape(-1)[:num_top]
    candidates = torch.cat([above, tied]).tolist()
    values = logprobs[candidates].tolist()
    ranked = sorted(zip(candidates, values), key=lambda pair: (-pair[1], pair[0]))
    return tuple(ranked[:num_top])


def token_logprobs(logits: torch.Tensor, token_id: int, num_top: int) -> TokenLogprobs:
    """Logprob, rank and top alternatives of ``token_id`` under softmax(logits). logits [V]."""
    if not 0 <= token_id < logits.shape[-1]:
        raise ValueError(f"token_id must be in [0, {logits.shape[-1]}), got {token_id}")
    logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)  # [V]
    chosen = logprobs[token_id]
    rank = 1 + int((logprobs > chosen).sum())
    return TokenLogprobs(token_id=token_id, logprob=float(chosen), rank=rank,
                         top=top_logprobs(logprobs, num_top))
