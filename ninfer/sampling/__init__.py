"""Sampling shared by both Programs: a pure function of (logits, params, seed, position, history).

See docs/sampling.md for the pipeline order, the formulas and the RNG definition.
"""

from ninfer.sampling.draw import draw, params_or_greedy
from ninfer.sampling.logprobs import TokenLogprobs, token_logprobs, top_logprobs
from ninfer.sampling.params import SamplingParams, SamplingParamsError, resolve_seed
from ninfer.sampling.philox import draw_bits, gumbel_noise, gumbel_scalar, philox4x32
from ninfer.sampling.processors import SamplingError, adjust_logits
from ninfer.sampling.sampler import RowSampling, processed_logits, sample, sample_row
from ninfer.sampling.speculative import Accepted, RowContext, accept, draft_vocabulary, draw_draft

__all__ = [
    "Accepted",
    "RowContext",
    "accept",
    "draft_vocabulary",
    "draw_draft",
    "RowSampling",
    "SamplingError",
    "SamplingParams",
    "SamplingParamsError",
    "TokenLogprobs",
    "adjust_logits",
    "draw",
    "draw_bits",
    "gumbel_noise",
    "gumbel_scalar",
    "params_or_greedy",
    "philox4x32",
    "processed_logits",
    "resolve_seed",
    "sample",
    "sample_row",
    "token_logprobs",
    "top_logprobs",
]
