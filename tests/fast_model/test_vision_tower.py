"""The fast vision tower against the reference tower on the same random tower (transformers-written, tiny, real
patch geometry): odd grids below and above the learned table, a two-frame grid. fp32 within relative RMS 1e-5 (on
CPU through the Triton interpreter, and with the naive ops), bf16 within 1e-2 on a GPU. Also: encodes run in the
workspace planned at start, and warm measures the attention candidates (GPU)."""

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from ninfer.convert.convert import convert_checkpoint
from ninfer.fast.model.vision import GRID_CACHE, FastVisionTower
from ninfer.reference.weights import load_vision_tower
from ninfer.testing.checkpoints import make_hf_checkpoint
from ninfer.testing.numerics import assert_close

GRIDS = [(1, 2, 2), (1, 10, 4), (1, 16, 12), (2, 4, 6)]
DTYPES = [(torch.float32, 1e-5)] + ([(torch.bfloat16, 1e-2)] if ON_GPU else [])


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    ckpt = make_hf_checkpoint(tmp_path_factory.mktemp("fv") / "ck", multimodal=True, seed=11)
    return convert_checkpoint(ckpt, ckpt.parent / "m.ninfer", progress=False)


@pytest.mark.parametrize("kernels", ["triton", "naive"])
@pytest.mark.parametrize("dtype, tol", DTYPES, ids=str)
def test_fast_tower_matches_the_reference(artifact, dtype, tol, kernels):
    ref = load_vision_tower(artifact, torch.float64)
    fast = FastVisionTower.from_artifact(artifact, dtype, DEVICE, kernels)
    fast.plan(16 * 12)
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
    assert fast.workspace.patches == 192


def test_encodes_run_in_the_planned_workspace(artifact):
    """After `plan(N)` every encode of at most N patches uses the same buffer (the same features as a tower
    without a plan, which sizes one at first use); the grid tables stay bounded."""
    fast = FastVisionTower.from_artifact(artifact, torch.float32, DEVICE)
    fast.plan(16 * 12)
    buffer = fast.workspace.buffer
    fresh = FastVisionTower.from_artifact(artifact, torch.float32, DEVICE)
    g = torch.Generator().manual_seed(5)
    grids = [(1, 16, 12), (1, 2, 2), (2, 4, 6), (1, 10, 4), (1, 4, 4), (1, 6, 2)]
    for grid in grids:
        pixels = torch.randn(grid[0] * grid[1] * grid[2], fast.cfg.patch_dim, generator=g)
        assert torch.equal(fast.encode(pixels, grid), fresh.encode(pixels, grid))
        assert fast.workspace.buffer is buffer
    assert len(fast._grids) == GRID_CACHE < len({g[1:] for g in grids})
    with pytest.raises(ValueError, match="does not fit"):
        fast.workspace.take("x", (16 * 12 + 1, fast.cfg.hidden_size))


@pytest.mark.skipif(not ON_GPU, reason="the attention candidates are timed with CUDA events")
def test_warm_measures_the_attention_candidates(artifact):
    fast = FastVisionTower.from_artifact(artifact, torch.bfloat16, DEVICE)
    fast.warm(16 * 12)
    names = [name for name, _ in fast.attention.timings]
    assert names == list(fast._candidates) and fast.attention.name in names
    assert isinstance(dict(fast.attention.timings)[fast.attention.name], float)


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


def test_the_fastest_agreeing_candidate_is_kept():
    """measure: a candidate that raises, writes NaN or disagrees with fp32 attention is skipped with the reason
    (the first one too: it is no reference); the fastest of the rest is kept (the times here are injected: the real
    timer is CUDA events)."""
    from ninfer.fast.model.vision_attend import measure
    from ninfer.fast.ops.vision_attention import vision_attention_naive

    def agreeing(ms):
        def attend(q, k, v, cu, L, out):
            return vision_attention_naive(q, k, v, cu)
        attend.ms = ms
        return attend

    def wrong(q, k, v, cu, L, out):
        return vision_attention_naive(q, k, v, cu) + 1.0

    def refuses(q, k, v, cu, L, out):
        raise RuntimeError("No available kernel.\nmore text")

    def nan(q, k, v, cu, L, out):
        return torch.full_like(q, float("nan"))

    wrong.ms = refuses.ms = nan.ms = 0.1  # faster than all: never kept
    found = {"wrong": wrong, "first": agreeing(3.0), "fast": agreeing(1.0), "nan": nan, "refuses": refuses,
             "slow": agreeing(5.0)}
    q, k, v = torch.randn(3, 10, 2, 8).unbind(0)
    cu = torch.tensor([0, 10], dtype=torch.int32)
    choice = measure(found, q, k, v, cu, 10, torch.empty(10, 2, 8), timer=lambda fn, repeats: fn.func.ms)
    assert choice.name == "fast"
    times = dict(choice.timings)
    assert list(times) == list(found) and (times["first"], times["slow"]) == (3.0, 5.0)
    assert times["refuses"] == "skipped: No available kernel."
    assert "relative RMS" in times["wrong"] and "relative RMS nan" in times["nan"]


def test_no_agreeing_candidate_is_a_start_error_naming_each_reason():
    """measure with nothing that agrees (the bf16 Triton kernel's wrong columns on Hopper, every SDPA backend
    refusing the head dim) raises, listing each candidate's reason, instead of keeping a wrong one."""
    from ninfer.fast.model.vision_attend import measure
    from ninfer.fast.ops.vision_attention import vision_attention_naive

    def wrong(q, k, v, cu, L, out):
        return vision_attention_naive(q, k, v, cu) * 2

    def refuses(q, k, v, cu, L, out):
        raise RuntimeError("No available kernel.")

    q, k, v = torch.randn(3, 10, 2, 8).unbind(0)
    with pytest.raises(RuntimeError, match="no vision attention candidate agrees.*wrong: skipped: relative RMS.*"
                                           "refuses: skipped: No available kernel"):
        measure({"wrong": wrong, "refuses": refuses}, q, k, v, torch.tensor([0, 10], dtype=torch.int32), 10,
                torch.empty(10, 2, 8), timer=lambda fn, repeats: 1.0)
