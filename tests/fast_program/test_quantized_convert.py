"""The fast Program on artifacts the converter writes (docs/quantization.md): every --quantize recipe from a bf16
checkpoint and every import of a published layout, dense and MoE, against the reference Program on the same file.
Prefill and decode logits within 1e-2 relative RMS (fp32: both dequantize exactly, so in practice ~1e-6), on the
naive kernels; one recipe through the Triton kernels (interpreted on CPU: -m slow). FP8 artifacts allow A8, which
the fast prefill takes (e4m3 activations, ~2% on this tiny model) and the reference never does: their prefill is held to 5e-2,
their decode (always A16) from a fresh sequence to 1e-2."""

from __future__ import annotations

import os

import pytest
import torch

from ninfer.convert.convert import convert_checkpoint
from ninfer.fast.program import FastProgram
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig
from ninfer.testing.checkpoints import make_hf_checkpoint
from ninfer.testing.numerics import assert_close
from ninfer.testing.quant_checkpoints import make_quantized_checkpoint

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
PROGRAM = dict(max_concurrency=1, max_context=64, page_size=4, kv_pages=20, checkpoint_slots=1, dtype=torch.float32)
IMPORTS = {"fp8": {}, "gptq": {"act_order": True}, "awq": {}, "compressed-tensors": {"symmetric": False},
           "modelopt": {}}


def _check(path, name, kernels="naive"):
    """All prefill logits of 37 tokens, then the same sequence's first 6 tokens decoded one by one from a fresh
    slot, on both Programs' models; returns the fast Program."""
    tokens = torch.arange(3, 40) % 500
    fast = FastProgram.from_artifact(path, budget_bytes=1 << 30, device=DEVICE,
                                     kernels="triton" if ON_GPU else kernels, **PROGRAM)
    m = fast.model
    m.pools.block_tables[0] = torch.arange(m.plan.max_pages_per_seq, dtype=torch.int32, device=DEVICE)
    got = m.prefill(tokens.to(DEVICE), 0, 0, 0, all_logits=True)
    ref = ReferenceProgram.from_artifact(path, ReferenceProgramConfig(**PROGRAM)).model
    want = ref.prefill(tokens, ref.new_state())
    a8 = any(getattr(w, "a8", False) for w in vars(m.weights.layers[0].mixer).values())
    assert_close(f"{name} prefill logits", want, got, 5e-2 if a8 else 1e-2)
    m.pools.reset_slot(0)
    one = lambda v: torch.tensor([v], dtype=torch.int32, device=DEVICE)  # noqa: E731
    decoded = torch.cat([m.decode(tokens[p:p + 1].to(DEVICE), one(0), one(0), one(p + 1), one(p)) for p in range(6)])
    assert_close(f"{name} decode logits", want[:6], decoded, 1e-2)
    return fast


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return {moe: make_hf_checkpoint(tmp_path_factory.mktemp(f"bf16{moe}"), moe=moe, dtype=torch.bfloat16)
            for moe in (False, True)}


@pytest.mark.parametrize("recipe", ["fp8", "q4", "q5", "nvfp4"])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_recipe_artifacts_on_the_fast_program(bf16, tmp_path, recipe, moe):
    path = convert_checkpoint(bf16[moe], tmp_path / f"{recipe}.ninfer", quantize=recipe, group_size=32,
                              progress=False)
    fast = _check(path, f"{recipe} {'moe' if moe else 'dense'}")
    formats = fast.model.weights.formats()
    assert {"fp8": "fp8_e4m3", "q4": "int4", "q5": "int5", "nvfp4": "nvfp4"}[recipe] in formats


@pytest.mark.parametrize("method", list(IMPORTS))
def test_imported_checkpoints_on_the_fast_program(tmp_path, method):
    src = make_quantized_checkpoint(tmp_path / method, method, moe=method in ("fp8", "modelopt"), **IMPORTS[method])
    path = convert_checkpoint(src, tmp_path / f"{method}.ninfer", progress=False)
    _check(path, f"{method} import")


@pytest.mark.slow
def test_q4_recipe_through_the_triton_kernels(bf16, tmp_path):
    path = convert_checkpoint(bf16[False], tmp_path / "q4.ninfer", quantize="q4", group_size=32, progress=False)
    _check(path, "q4 triton", kernels="triton")
