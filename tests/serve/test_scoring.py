"""The CausalScoring purpose: the reference CausalScoring's argmax fields agree with its logprobs, the core is
serial and bounded, and /v1/completions answers lm-eval's loglikelihood request with those numbers."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from ninfer.contracts import RejectReason, RequestRejected
from ninfer.engine.scoring import CausalScoreCore
from ninfer.reference.program import CausalScoring


@pytest.mark.parametrize("n, window, stride", [(1, 8, 4), (5, 8, 4), (30, 8, 3), (30, 64, 32), (17, 2, 1)])
def test_scorer_argmax_fields_agree_with_its_logprobs(score_runtime, n, window, stride):
    model = score_runtime.scorer.scorer.model
    tokens = [(7919 * i + 13) % 5000 for i in range(n)]
    ours = CausalScoring(model).score(tokens, window=window, stride=stride)
    assert len(ours.top) == len(ours.logprobs) == len(ours.greedy) == n - 1 and ours.windows >= 1
    for j, (lp, (best, best_lp), greedy) in enumerate(zip(ours.logprobs, ours.top, ours.greedy)):
        assert best_lp >= lp - 1e-6
        assert greedy == (best == tokens[j + 1]) and (not greedy or best_lp == lp)
    begin = -(-max(0, n - window) // stride) * stride  # the first stride step whose window reaches the end
    last = model.prefill(torch.tensor(tokens[begin:]), model.new_state())[-1]  # [V]
    assert ours.next_top[0] == int(last.argmax())


def test_core_is_serial_bounded_and_fails_closed():
    inside, peak, release = [0], [0], threading.Event()

    class Slow:
        def score(self, tokens, *, window, stride):
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
            release.wait(5)
            inside[0] -= 1
            if tokens == (666,):
                raise RuntimeError("model state broken")
            return tokens

    core = CausalScoreCore(Slow(), window=8, stride=4, max_waiting=2)
    threads = [threading.Thread(target=core.score, args=([1, 2],)) for _ in range(2)]
    for t in threads:
        t.start()
    while core.outstanding < 2:
        pass
    with pytest.raises(RequestRejected) as e:
        core.score([3])
    assert e.value.reason is RejectReason.OVERLOADED
    release.set()
    for t in threads:
        t.join()
    assert peak[0] == 1 and core.outstanding == 0
    with pytest.raises(RequestRejected) as e:
        core.score([666])
    assert e.value.reason is RejectReason.ENGINE_UNAVAILABLE and not core.available
    with pytest.raises(RequestRejected):
        core.score([1])


def test_core_rejects_bad_input_without_failing():
    class Picky:
        def score(self, tokens, *, window, stride):
            raise ValueError("no")

    core = CausalScoreCore(Picky(), window=8)
    assert core.stride == 4
    for tokens in ([], [5]):
        with pytest.raises(RequestRejected) as e:
            core.score(tokens, vocab_size=10) if tokens else core.score(tokens)
        assert e.value.reason is RejectReason.UNREPRESENTABLE
    with pytest.raises(RequestRejected):
        core.score([11], vocab_size=10)
    assert core.available


def test_loglikelihood_request_matches_the_reference(score_client, score_runtime):
    """lm-eval's payload: token-id lists, echo, max_tokens 1, logprobs 1, temperature 0."""
    model = score_runtime.scorer.scorer.model
    prompts = [[100, 200, 300, 400, 500], [7, 8]]
    body = score_client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 1, "echo": True,
                                                      "logprobs": 1, "temperature": 0, "seed": 1234}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for prompt, choice in zip(prompts, body["choices"]):
        lp = choice["logprobs"]
        ref = CausalScoring(model).score(prompt, window=64, stride=32)
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert len(lp["token_logprobs"]) == len(prompt) + 1  # the prompt, then the one generated token
        assert lp["token_logprobs"][1:-1] == pytest.approx(ref.logprobs, abs=1e-5)
        for tok_lp, top, greedy in zip(lp["token_logprobs"][1:-1], lp["top_logprobs"][1:-1], ref.greedy):
            assert (tok_lp == max(top.values())) == greedy  # lm-eval's is_greedy test
        assert lp["token_logprobs"][-1] == max(lp["top_logprobs"][-1].values())  # greedy next token
    zero = score_client.post("/v1/completions", json={"prompt": "hello world", "max_tokens": 0, "echo": True,
                                                      "logprobs": 0}).json()["choices"][0]
    assert zero["text"] == "hello world" and len(zero["logprobs"]["tokens"]) == 2
    assert math.isfinite(zero["logprobs"]["token_logprobs"][1])


def test_long_text_uses_windows(score_client, score_runtime):
    tokens = [(31 * i + 5) % 3000 for i in range(150)]
    lp = score_client.post("/v1/completions", json={"prompt": tokens, "max_tokens": 0, "echo": True,
                                                    "logprobs": 1}).json()["choices"][0]["logprobs"]
    ref = CausalScoring(score_runtime.scorer.scorer.model).score(tokens, window=64, stride=32)
    assert ref.windows > 1
    assert lp["token_logprobs"][1:] == pytest.approx(ref.logprobs, abs=1e-5)
