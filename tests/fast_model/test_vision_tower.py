"""The fast vision tower against the reference tower on the same random tower (transformers-written, tiny, real
patch geometry): odd grids below and above the learned table, a two-frame grid. fp32 within relative RMS 1e-5 (on
CPU through the Triton interpreter), bf16 within 1e-2 on a GPU."""

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from ninfer.convert.convert import convert_checkpoint
from ninfer.fast.model.vision import FastVisionTower
from ninfer.reference.weights import load_vision_tower
from ninfer.testing.checkpoints import make_hf_checkpoint
from ninfer.testing.numerics import assert_close

GRIDS = [(1, 2, 2), (1, 10, 4), (1, 16, 12), (2, 4, 6)]
DTYPES = [(torch.float32, 1e-5)] + ([(torch.bfloat16, 1e-2)] if ON_GPU else [])


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    ckpt = make_hf_checkpoint(tmp_path_factory.mktemp("fv") / "ck", multimodal=True, seed=11)
    return convert_checkpoint(ckpt, ckpt.parent / "m.ninfer", progress=False)


@pytest.mark.parametrize("dtype, tol", DTYPES, ids=str)
def test_fast_tower_matches_the_reference(artifact, dtype, tol):
    ref = load_vision_tower(artifact, torch.float64)
    fast = FastVisionTower.from_artifact(artifact, dtype, DEVICE)
    g = torch.Generator().manual_seed(3)
    for grid in GRIDS:
        t, h, w = grid
        pixels = torch.randn(t * h * w, ref.cfg.patch_dim, generator=g, dtype=torch.float64)
        want = ref.encode(pixels, grid)
        got = fast.encode(pixels.to(DEVICE, torch.float32), grid)
        assert_close(f"vision tower {grid}", want, got.float().cpu(), tol)


def test_warm_runs_the_largest_grid(artifact):
    fast = FastVisionTower.from_artifact(artifact, torch.float32, DEVICE)
    fast.warm(48 * 4)
    assert (12, 12) in fast._grids  # 192 patches: the largest whole-block square, 12 x 12 = 144 <= 192


@pytest.mark.skipif(not ON_GPU, reason="device memory statistics need CUDA")
def test_workspace_bound_covers_an_encode(artifact):
    """The bytes the fast Program takes off its budget for one encode (`workspace_bytes`) cover what an encode
    really holds at its peak (1 MiB of slack for the allocator's rounding of these tiny tensors)."""
    fast = FastVisionTower.from_artifact(artifact, torch.bfloat16, DEVICE)
    grid, n = (1, 16, 12), 192
    pixels = torch.randn(n, fast.cfg.patch_dim, device=DEVICE)
    fast.encode(pixels, grid)  # the grid's tables are cached, not transients
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fast.encode(pixels, grid)
    assert torch.cuda.max_memory_allocated() - base <= fast.workspace_bytes(n) + (1 << 20)
