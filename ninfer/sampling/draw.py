"""One Program-side draw: what both Programs do with a row's fp32 logits [V] at an absolute position."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ninfer.sampling.logprobs import token_logprobs
from ninfer.sampling.params import SamplingParams
from ninfer.sampling.sampler import RowSampling, sample_row

GREEDY = SamplingParams(temperature=0.0)


def params_or_greedy(sampling: Any) -> SamplingParams:
    """A request's SamplingParams as a Program receives it; None is greedy."""
    if sampling is None:
        return GREEDY
    if isinstance(sampling, SamplingParams):
        return sampling
    raise TypeError(f"sampling must be SamplingParams or None, got {type(sampling).__name__}")


def draw(logits: torch.Tensor, params: SamplingParams, seed: int, position: int, *, prompt: Sequence[int],
         outputs: Sequence[int], eos_token_ids: tuple[int, ...], mask: Any | None
         ) -> tuple[int, tuple[float, tuple] | None]:
    """The token at `position`, and (its raw logprob, the top alternatives) when the request asked for logprobs."""
    row = RowSampling(params, seed, position, prompt_token_ids=prompt, output_token_ids=outputs,
                      eos_token_ids=eos_token_ids, allowed=mask)
    token = sample_row(logits, row)
    if params.logprobs is None:
        return token, None
    lp = token_logprobs(logits, token, params.logprobs)
    return token, (lp.logprob, lp.top)
