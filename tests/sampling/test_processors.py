"""Steps 1-4: logit_bias, the allowed-token mask, the min_tokens stop mask, penalties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.sampling.params import SamplingParams
from ninfer.sampling.processors import (
    SamplingError, adjust_logits, allowed_to_bool, apply_logit_bias, apply_min_tokens,
    apply_penalties, min_tokens_blocked,
)

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)
INF = math.inf


def adjust(logits, params, prompt=(), output=(), eos=(), allowed=None):
    return adjust_logits(torch.tensor(logits), params, prompt_token_ids=prompt,
                         output_token_ids=output, eos_token_ids=eos, allowed=allowed).tolist()


def test_logit_bias_adds_exactly_and_leaves_input_untouched():
    x = torch.tensor([0.5, -1.0, 2.0])
    out = apply_logit_bias(x, SamplingParams.create(logit_bias={0: 1.25, 2: -100}))
    assert out.tolist() == [1.75, -1.0, -98.0]
    assert x.tolist() == [0.5, -1.0, 2.0]


def test_logit_bias_out_of_vocab_is_refused():
    with pytest.raises(SamplingError, match="logit_bias"):
        apply_logit_bias(torch.zeros(3), SamplingParams.create(logit_bias={3: 1.0}))


def test_logit_bias_comes_before_penalties():
    # token 0 was seen; -1 + 2 = 1 > 0 so the repetition penalty divides: 1 / 2
    params = SamplingParams.create(logit_bias={0: 2.0}, repetition_penalty=2.0)
    assert adjust([-1.0, 0.0], params, prompt=[0])[0] == 0.5


@SETTINGS
@given(vocab=st.integers(1, 100), data=st.data())
def test_bitmask_and_bool_masks_agree(vocab, data):
    words = (vocab + 31) // 32
    raw = data.draw(st.lists(st.integers(-(1 << 31), (1 << 31) - 1), min_size=words, max_size=words))
    keep = [bool((raw[t // 32] >> (t % 32)) & 1) for t in range(vocab)]
    assert allowed_to_bool(torch.tensor(raw, dtype=torch.int32), vocab).tolist() == keep
    mask = torch.tensor(keep)
    assert allowed_to_bool(mask, vocab) is mask


def test_allowed_mask_sets_minus_inf():
    bitmask = torch.tensor([0b101], dtype=torch.int32)
    assert adjust([1.0, 2.0, 3.0], SamplingParams(), allowed=bitmask) == [1.0, -INF, 3.0]
    with pytest.raises(SamplingError, match="allowed"):
        adjust([1.0, 2.0, 3.0], SamplingParams(), allowed=torch.tensor([True, False]))


def test_min_tokens_blocks_eos_and_stop_ids_until_reached():
    params = SamplingParams.create(min_tokens=2, stop_token_ids=[1])
    logits = [0.0, 0.0, 9.0, 0.0]
    assert adjust(logits, params, output=[0], eos=[2]) == [0.0, -INF, -INF, 0.0]
    assert adjust(logits, params, output=[0, 0], eos=[2]) == logits
    assert min_tokens_blocked(params, 1, (3, 2)) == (1, 2, 3)
    assert min_tokens_blocked(params, 2, (3, 2)) == ()


def test_ignore_eos_leaves_eos_unblocked():
    params = SamplingParams.create(min_tokens=5, stop_token_ids=[1], ignore_eos=True)
    assert min_tokens_blocked(params, 0, (2,)) == (1,)
    out = apply_min_tokens(torch.zeros(3), params, 0, (2,))
    assert out.tolist() == [0.0, -INF, 0.0]


def test_penalties_match_a_hand_computation():
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    x = torch.tensor([2.0, -2.0, 1.0, 0.5, -1.0])
    out = apply_penalties(x, params, prompt_token_ids=[0], output_token_ids=[1, 2, 2])
    # 0: prompt-only, 2 / 2; 1: -2 * 2 - 0.5 - 0.25; 2: 1 / 2 - 2 * 0.5 - 0.25; 3, 4 unseen
    assert out.tolist() == [1.0, -4.75, -0.75, 0.5, -1.0]


def test_presence_and_frequency_ignore_prompt_tokens():
    params = SamplingParams(frequency_penalty=1.0, presence_penalty=1.0)
    out = apply_penalties(torch.zeros(3), params, prompt_token_ids=[0, 0], output_token_ids=[1])
    assert out.tolist() == [0.0, -2.0, 0.0]


@SETTINGS
@given(logits=st.lists(st.floats(-30, 30, width=32), min_size=2, max_size=12),
       rep=st.floats(0.1, 2.0), freq=st.floats(-2, 2), pres=st.floats(-2, 2), data=st.data())
def test_penalties_agree_with_a_float32_scalar_model(logits, rep, freq, pres, data):
    vocab = len(logits)
    history = st.lists(st.integers(0, vocab - 1), max_size=8)
    prompt, output = data.draw(history), data.draw(history)
    params = SamplingParams(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres)
    got = apply_penalties(torch.tensor(logits), params, prompt, output)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    for t, value in enumerate(logits):
        expected = f32(value)
        if t in prompt or t in output:
            expected = expected / f32(rep) if expected > 0 else expected * f32(rep)
        expected = expected - f32(freq) * f32(output.count(t))
        expected = expected - f32(pres) * f32(float(t in output))
        assert got[t].item() == expected.item()


def test_masked_tokens_stay_masked_through_penalties():
    params = SamplingParams.create(min_tokens=1, repetition_penalty=1.5, frequency_penalty=-2.0)
    assert adjust([1.0, 1.0], params, prompt=[1], output=[], eos=[1])[1] == -INF


def test_history_ids_outside_the_vocab_are_refused():
    with pytest.raises(SamplingError, match="output_token_ids"):
        apply_penalties(torch.zeros(3), SamplingParams(presence_penalty=1.0), [], [3])
    with pytest.raises(SamplingError, match="eos_token_ids"):
        apply_min_tokens(torch.zeros(3), SamplingParams(min_tokens=1), 0, (7,))
