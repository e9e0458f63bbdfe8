"""SamplingParams validation and the per-choice seed rule."""

import pytest

from ninfer.sampling.params import SamplingParams, SamplingParamsError, resolve_seed

BAD_FIELDS = [
    ("temperature", {"temperature": -0.1}),
    ("temperature", {"temperature": float("nan")}),
    ("top_k", {"top_k": -2}),
    ("top_k", {"top_k": 1.5}),
    ("top_p", {"top_p": 0.0}),
    ("top_p", {"top_p": 1.01}),
    ("min_p", {"min_p": -0.01}),
    ("min_p", {"min_p": 1.5}),
    ("repetition_penalty", {"repetition_penalty": 0.0}),
    ("presence_penalty", {"presence_penalty": 2.5}),
    ("frequency_penalty", {"frequency_penalty": -2.01}),
    ("frequency_penalty", {"frequency_penalty": float("inf")}),
    ("logit_bias", {"logit_bias": {1: 0.5}}),
    ("logit_bias", {"logit_bias": ((1, 101.0),)}),
    ("logit_bias", {"logit_bias": ((-1, 1.0),)}),
    ("logit_bias", {"logit_bias": ((3, 1.0), (3, 2.0))}),
    ("min_tokens", {"min_tokens": -1}),
    ("min_tokens", {"min_tokens": 5, "max_tokens": 4}),
    ("max_tokens", {"max_tokens": 0}),
    ("n", {"n": 0}),
    ("n", {"n": True}),
    ("stop_token_ids", {"stop_token_ids": [1, 2]}),
    ("stop_token_ids", {"stop_token_ids": (1, -2)}),
    ("ignore_eos", {"ignore_eos": 1}),
    ("seed", {"seed": 1 << 64}),
    ("seed", {"seed": "7"}),
    ("logprobs", {"logprobs": 21}),
    ("logprobs", {"logprobs": -1}),
]


@pytest.mark.parametrize("field,kwargs", BAD_FIELDS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_FIELDS)])
def test_invalid_values_name_their_field(field, kwargs):
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**kwargs)
    assert info.value.field == field
    assert repr(field) in str(info.value)


def test_defaults_are_valid_and_not_greedy():
    params = SamplingParams()
    assert not params.is_greedy and params.effective_top_k == 0 and not params.has_penalties


def test_range_edges_are_accepted():
    SamplingParams(temperature=0.0, top_k=-1, top_p=1.0, min_p=1.0, presence_penalty=-2.0,
                   frequency_penalty=2.0, logit_bias=((0, -100.0), (5, 100)), min_tokens=3,
                   max_tokens=3, seed=-(1 << 63), logprobs=20)
    SamplingParams(seed=(1 << 64) - 1, logprobs=0, temperature=7.5)


def test_greedy_threshold_follows_vllm():
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(temperature=0.9e-5).is_greedy
    assert not SamplingParams(temperature=1e-5).is_greedy


def test_create_normalises_request_shapes():
    params = SamplingParams.create(logit_bias={9: 1.5, 2: -3}, stop_token_ids=[7, 4], top_k=-1)
    assert params.logit_bias == ((2, -3), (9, 1.5))
    assert params.stop_token_ids == (7, 4)
    assert params.effective_top_k == 0
    assert SamplingParams.create() == SamplingParams()


def test_params_are_frozen_and_hashable():
    params = SamplingParams(top_k=3)
    with pytest.raises(AttributeError):
        params.top_k = 4
    assert hash(params) == hash(SamplingParams(top_k=3))


def test_resolve_seed_gives_each_choice_its_own_seed():
    assert [resolve_seed(10, j) for j in range(3)] == [10, 11, 12]
    assert resolve_seed((1 << 64) - 1, 1) == 0
    assert resolve_seed(-1, 0) == (1 << 64) - 1
    fresh = {resolve_seed(None) for _ in range(8)}
    assert len(fresh) == 8 and all(0 <= s < 1 << 64 for s in fresh)
