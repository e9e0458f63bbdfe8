"""Logprobs: of the raw model distribution by default, chosen token plus top-n."""

import math

import pytest
import torch

from ninfer.sampling.logprobs import token_logprobs, top_logprobs
from ninfer.sampling.params import SamplingParams
from ninfer.sampling.sampler import RowSampling, processed_logits, sample_row


def test_raw_logprobs_ignore_the_sampling_transformations():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    params = SamplingParams.create(temperature=0.3, top_k=2, logit_bias={1: 5.0})
    token = sample_row(logits, RowSampling(params, seed=4, position=0))
    out = token_logprobs(logits, token, num_top=2)
    raw = torch.log_softmax(logits, dim=-1)
    assert out.token_id == token and out.logprob == raw[token].item()
    assert out.top == ((0, raw[0].item()), (1, raw[1].item()))


def test_rank_and_ties_in_the_top_list():
    logits = torch.tensor([1.0, 3.0, 3.0, 0.0, 3.0])
    out = token_logprobs(logits, 3, num_top=4)
    assert out.rank == 5
    assert [t for t, _ in out.top] == [1, 2, 4, 0]
    tied = token_logprobs(logits, 4, num_top=0)
    assert tied.top == () and tied.rank == 1  # tokens as likely as the chosen one do not count
    assert math.isclose(math.fsum(math.exp(v) for _, v in token_logprobs(logits, 0, 9).top), 1.0,
                        rel_tol=1e-6)


def test_processed_logprobs_follow_the_drawn_distribution():
    logits = torch.tensor([math.log(p) for p in (0.4, 0.3, 0.2, 0.1)])
    row = RowSampling(SamplingParams(top_k=2), seed=0, position=0)
    out = token_logprobs(processed_logits(logits, row), 0, num_top=3)
    assert math.isclose(out.logprob, math.log(4 / 7), rel_tol=1e-6)
    assert [t for t, _ in out.top] == [0, 1, 2] and out.top[2][1] == -math.inf


def test_top_list_with_many_masked_ties_stays_small_and_ordered():
    logprobs = torch.full((1000,), -math.inf)
    logprobs[500] = 0.0
    assert top_logprobs(logprobs, 3) == ((500, 0.0), (0, -math.inf), (1, -math.inf))


def test_out_of_vocab_token_is_refused():
    with pytest.raises(ValueError, match="token_id"):
        token_logprobs(torch.zeros(3), 3, 1)
