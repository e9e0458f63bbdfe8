"""On one GPU (NINFER_TEST_DEVICE=cuda): `--devices 0,0 --program fast` plans both stages against the GPU's real
budget (the two ranks pooled on one device) and is refused, naming the KV pages that fit, until the fast Program
runs stages (docs/pipeline.md, issue 16)."""

import os

import pytest
import torch

from ninfer.convert.default_model import default_model_path
from ninfer.errors import UnavailableError
from ninfer.pipeline import plan_stages, stage_memory
from ninfer.pipeline.budgets import device_budgets, stage_kv_pages
from ninfer.runtime_options import RuntimeOptions
from ninfer.wiring import _refuse_fast_stages

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()


@pytest.mark.skipif(not ON_GPU, reason="real device budgets: CUDA (NINFER_TEST_DEVICE=cuda)")
def test_two_stages_on_one_gpu_fit_and_are_refused():
    from ninfer.artifact import open_artifact

    path = default_model_path()
    with open_artifact(path) as art:
        cfg = art.config
    plan = plan_stages(cfg, ("cuda:0", "cuda:0"))
    budgets = device_budgets(plan.devices, 0.5)
    pages, memory = stage_kv_pages(cfg, plan, budgets, page_size=16, slots=20, with_mtp=False)
    one = stage_memory(cfg, plan_stages(cfg, ("cuda:0",)), page_size=16)[0]
    # the two ranks' pages together are one model's page: the shared GPU holds what one stage would
    assert sum(m.page_bytes for m in memory) == one.page_bytes and pages > 0
    assert budgets[0] <= torch.cuda.get_device_properties(0).total_memory
    with pytest.raises(UnavailableError, match="KV pages per device"):
        _refuse_fast_stages(path, RuntimeOptions(devices=plan.devices, gpu_memory_utilization=0.5), None)
