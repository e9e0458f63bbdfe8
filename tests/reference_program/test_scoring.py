"""CausalScoring: per-token logprobs and greedy flags, in one window and over sliding windows with a stride."""

from __future__ import annotations

import pytest
import torch

from ninfer.reference.program import CausalScoring


def direct(model, tokens, begin, p):
    """log p(tokens[p] | tokens[begin:p]) and whether it is the argmax, from a fresh full forward."""
    logits = model.prefill(torch.tensor(tokens[begin:p]), model.new_state())[-1]
    logp = torch.log_softmax(logits.double(), -1)
    return float(logp[tokens[p]]), int(torch.argmax(logp)) == tokens[p]


def test_one_window_equals_log_softmax_of_the_full_forward(model64, prompt_of):
    tokens = prompt_of(40, seed=7)
    result = CausalScoring(model64).score(tokens, window=64, stride=32)
    logp = torch.log_softmax(model64.prefill(torch.tensor(tokens), model64.new_state()), -1)  # [40, V]
    want = [float(logp[p - 1, tokens[p]]) for p in range(1, 40)]
    assert result.windows == 1 and len(result.logprobs) == 39
    assert max(abs(a - b) for a, b in zip(result.logprobs, want)) < 1e-12
    assert list(result.greedy) == [int(torch.argmax(logp[p - 1])) == tokens[p] for p in range(1, 40)]
    assert result.total == pytest.approx(sum(want))


@pytest.mark.parametrize("window, stride", [(16, 8), (10, 9), (12, 1), (70, 30)])
def test_sliding_windows_equal_a_direct_computation(model64, prompt_of, window, stride):
    tokens = prompt_of(90, seed=8)
    result = CausalScoring(model64).score(tokens, window=window, stride=stride)
    want, scored = [], 1
    for begin in range(0, len(tokens), stride):
        end = min(begin + window, len(tokens))
        want += [direct(model64, tokens, begin, p) for p in range(scored, end)]
        scored = end
        if end == len(tokens):
            break
    assert len(result.logprobs) == len(tokens) - 1
    assert max(abs(a - b[0]) for a, b in zip(result.logprobs, want)) < 1e-10
    assert list(result.greedy) == [g for _, g in want]


def test_a_greedy_continuation_is_all_greedy(model64, prompt_of):
    tokens = list(prompt_of(5, seed=9))
    state = model64.new_state()
    logits = model64.prefill(torch.tensor(tokens), state)[-1]
    for _ in range(12):
        tokens.append(int(torch.argmax(logits)))
        logits = model64.decode_step(tokens[-1], state)
    result = CausalScoring(model64).score(tokens, window=32, stride=16)
    assert all(result.greedy[4:])


def test_scoring_leaves_the_program_untouched(make_program, prompt_of):
    program = make_program()
    before = program.resource_usage()
    program.scoring().score(prompt_of(30), window=8, stride=4)
    assert program.resource_usage() == before
    program.check_invariants()


@pytest.mark.parametrize("window, stride", [(8, 8), (8, 0), (1, 1)])
def test_bad_windows_are_refused(model32, window, stride):
    with pytest.raises(ValueError, match="window"):
        CausalScoring(model32).score([1, 2, 3], window=window, stride=stride)
