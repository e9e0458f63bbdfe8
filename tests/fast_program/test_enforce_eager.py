"""`FastProgramConfig.cuda_graphs` False (`--enforce-eager`): the one switch reaches every runner that could capture
(the decode runner, the sampler's prefill draws, the MTP round's verify and draft runners; the prefill graphs resolve
to none), nothing is captured, the Program serves what the default one serves, and on CUDA the start-up costs are
still measured, the plain decode step from an eager step. On the CPU nothing is captured either way, so the switch is
seen where the Program hands it to each runner; with NINFER_TEST_DEVICE=cuda the same tests see the graphs absent
and the costs measured."""

from __future__ import annotations

import os

import pytest
import torch

from ninfer.contracts import PrefillCosts
from ninfer.fast.program import program as fast_program
from ninfer.fast.program.config import GRAPHED_PREFILL_TOKENS, FastProgramConfig
from ninfer.testing.serving import serve
from ninfer.testing.sessions import token_request

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
CAPTURING = ("DeviceSampler", "DecodeGraphRunner", "VerifyGraphRunner", "DraftGraphRunner")


def test_cuda_graphs_off_resolves_to_no_prefill_graphs(tiny):
    cfg, _ = tiny
    graphed, eager = FastProgramConfig(), FastProgramConfig(cuda_graphs=False)
    assert graphed.on_device("cuda").prefill_graph_tokens == GRAPHED_PREFILL_TOKENS
    assert eager.on_device("cuda").prefill_graph_tokens == eager.on_device("cpu").prefill_graph_tokens == 0
    with pytest.raises(ValueError, match="cuda_graphs=False"):
        FastProgramConfig(cuda_graphs=False, prefill_graph_tokens=128).resolved(cfg)


@pytest.fixture
def handed(monkeypatch):
    """The use_graphs each capturing runner the fast Program builds was handed, by class name."""
    asked = {}
    for name in CAPTURING:
        def built(*args, _cls=getattr(fast_program, name), _name=name, **kw):
            asked[_name] = kw.get("use_graphs")
            return _cls(*args, **kw)
        monkeypatch.setattr(fast_program, name, built)
    return asked


@pytest.mark.parametrize("k", [0, 2], ids=["plain", "mtp"])
def test_enforce_eager_captures_nothing_and_serves_the_same(make_fast_spec, prompt_of, handed, k):
    program = make_fast_spec(k, cuda_graphs=False)
    ex, sampler = program.executor, program.sampler
    runners = [program.runner, sampler] + ([ex.verifier, ex.drafter] if k else [])
    assert handed == {name: False for name in CAPTURING[:len(runners)]}
    assert all(not r.use_graphs and not r.graphs for r in runners) and program.pieces is None
    assert program.model.plan.prefill_graph_tokens == 0  # no prefill graphs' pool planned
    costs = program.limits.prefill
    if ON_GPU:  # measured eagerly: a plain step per B, none under the MTP backend
        assert costs.measured and costs.graph_buckets == ()
        assert len(costs.decode_step_s) == (0 if k else program.limits.max_concurrency)
        assert all(0 < s < 0.1 for s in costs.decode_step_s)
    else:
        assert costs == PrefillCosts()
    requests = lambda: [token_request(prompt_of(9 + 5 * i, seed=i), 7) for i in range(3)]  # noqa: E731
    got = serve(program, requests(), max_concurrency=2)
    want = serve(make_fast_spec(k), requests(), max_concurrency=2)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]


def test_the_plain_step_cost_is_an_eager_step_without_graphs(make_fast, monkeypatch):
    """`measure_prefill` over a runner without graphs (what a CUDA Program with cuda_graphs off hands it; the CPU
    timer stands in for the CUDA-synchronized one) times one greedy step per B = 1..max_batch, each running B dummy
    rows through the model; no runner (a speculative backend): no plain step."""
    from ninfer.fast.program import costs

    program = make_fast(cuda_graphs=False)
    model, steps = program.model, []
    decode = model.decode
    monkeypatch.setattr(model, "decode", lambda tokens, *a: steps.append(len(tokens)) or decode(tokens, *a))
    monkeypatch.setattr(costs, "_best", lambda device, fn, repeats=3: (fn(), 1e-3)[1])
    measured = costs.measure_prefill(model, program.runner, 64, "cpu")
    assert measured.decode_step_s == (1e-3,) * program.limits.max_concurrency and steps == [1, 2]
    assert costs.measure_prefill(model, None, 64, "cpu").decode_step_s == ()
