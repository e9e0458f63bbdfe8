"""On one GPU (NINFER_TEST_DEVICE=cuda): `--devices 0,0 --program fast` plans both stages against the GPU's real
budget (the two ranks pooled on one device) and runs them with a chain of decode graphs per rank per exact B (and
the short prefill pieces' graphs over both ranks), generating what one stage generates (docs/pipeline.md).
tests/fast_program/test_pipeline.py runs its CPU twins on the GPU too (`0,0` with the Triton kernels and graphs,
every rank's pools the single-stage bytes)."""

import gc
import os

import pytest
import torch

from ninfer.convert.default_model import default_model_path
from ninfer.pipeline import plan_stages, stage_memory
from ninfer.pipeline.budgets import device_budgets, stage_kv_pages

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not ON_GPU, reason="real device budgets: CUDA (NINFER_TEST_DEVICE=cuda)")


def test_two_stages_on_one_gpu_fit_in_one_stages_budget():
    from ninfer.artifact import open_artifact

    with open_artifact(default_model_path()) as art:
        cfg = art.config
    plan = plan_stages(cfg, ("cuda:0", "cuda:0"))
    budgets = device_budgets(plan.devices, 0.5)
    pages, memory = stage_kv_pages(cfg, plan, budgets, page_size=16, slots=20, with_mtp=False)
    one = stage_memory(cfg, plan_stages(cfg, ("cuda:0",)), page_size=16)[0]
    # the two ranks' pages together are one model's page: the shared GPU holds what one stage would
    assert sum(m.page_bytes for m in memory) == one.page_bytes and pages > 0
    assert budgets[0] <= torch.cuda.get_device_properties(0).total_memory


def _generate(devices: tuple[str, ...] | None) -> tuple[list[tuple[int, ...]], dict]:
    """Three requests (greedy, sampled, greedy sharing the first's prefix) through the Engine on the default model."""
    from ninfer.fast.program import FastProgram
    from ninfer.fast.stage_graphs import GraphChain
    from ninfer.sampling import SamplingParams
    from ninfer.testing.serving import serve
    from ninfer.testing.sessions import token_request

    program = FastProgram.from_artifact(default_model_path(), max_concurrency=2, max_context=512,
                                        gpu_memory_utilization=0.4, devices=devices)
    prompt = tuple(range(3, 40))
    requests = [token_request(prompt, 12), token_request(prompt[:20] + (9,), 12, seed=5,
                                                         sampling=SamplingParams(temperature=1.0, top_k=20)),
                token_request(prompt + (7, 7), 10)]
    tokens = [r.token_ids for r in serve(program, requests, max_concurrency=2)]
    facts = dict(chains=sum(isinstance(g, GraphChain) for g in program.runner.graphs.values()),
                 prefill_graphs=0 if program.pieces is None else len(program.pieces.graphs),
                 graphs=len(program.runner.graphs), passes=0 if program.link is None else program.link.passes,
                 pages=program.model.plan.num_pages)
    del program
    gc.collect()
    torch.cuda.empty_cache()
    return tokens, facts


def test_two_stages_on_one_gpu_run_graph_chains_and_equal_one_stage():
    want, one = _generate(None)
    got, two = _generate(("cuda:0", "cuda:0"))
    assert got == want
    assert two["chains"] == two["graphs"] == one["graphs"] > 0 and one["chains"] == 0 and two["passes"] > 0
    assert two["prefill_graphs"] == one["prefill_graphs"] > 0  # the short pieces' graphs hold both ranks on 0,0
