"""The vision tower's per-grid CUDA graphs (`vision_graphs.py`): the policy on the CPU through a stand-in capture
whose replay reruns the captured body (as a graph reruns its kernels on the same buffers), and the real capture on a
GPU. A grid's first encode runs eagerly, its second captures and replays, later ones replay; every replay reads the
pixels staged for it (a graph that kept its capture's pixels would repeat the old features); at most `limit` graphs
are kept; a plan drops them; a failed capture turns graphs off with its reason and still returns the features."""

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from ninfer.convert.convert import convert_checkpoint
from ninfer.fast.model.vision import GRID_CACHE, FastVisionTower
from ninfer.fast.model.vision_graphs import VisionGraphs
from ninfer.testing.checkpoints import make_hf_checkpoint


class StandIn:
    """A capture whose graph's replay reruns the body into the captured output. A real capture runs no kernel, so
    this one undoes its run's writes to `memory` (the tower's workspace: the staged pixels are in it)."""

    def __init__(self, fail: bool = False, memory=lambda: torch.zeros(1)):
        self.captures = self.replays = 0
        self.fail, self.memory = fail, memory

    def __call__(self, body, pool):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing\ndetail")
        self.captures += 1
        before = self.memory().clone()
        out = body()
        self.memory().copy_(before)
        stand_in = self

        class Graph:
            def pool(self):
                return None

            def replay(self):
                stand_in.replays += 1
                out.copy_(body())
        return Graph(), out


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    ckpt = make_hf_checkpoint(tmp_path_factory.mktemp("vg") / "ck", multimodal=True, seed=13)
    return convert_checkpoint(ckpt, ckpt.parent / "m.ninfer", progress=False)


def test_second_encode_captures_and_replays_read_the_new_pixels(artifact):
    eager = FastVisionTower.from_artifact(artifact, torch.float32, "cpu", "naive", use_graphs=False)
    fast = FastVisionTower.from_artifact(artifact, torch.float32, "cpu", "naive")
    capture = StandIn(memory=lambda: fast.workspace.buffer)
    fast.graphs = VisionGraphs(True, GRID_CACHE, capture)
    grid, dim = (1, 4, 6), fast.cfg.patch_dim
    for n in range(4):
        pixels = torch.randn(24, dim, generator=torch.Generator().manual_seed(n))
        got = fast.encode(pixels, grid)
        assert torch.equal(got, eager.encode(pixels, grid)), n
        assert (capture.captures, capture.replays) == ((0, 0), (1, 1), (1, 2), (1, 3))[n]
    kept = fast.encode(torch.randn(24, dim), grid)
    fast.encode(torch.randn(24, dim), grid)
    assert not torch.equal(kept, fast.graphs.graphs[grid][1])  # a replay's features are the caller's copy


def test_graphs_are_bounded_and_dropped_by_a_plan():
    capture = StandIn()
    graphs = VisionGraphs(True, 2, capture)
    for grid in [(1, 2, 2), (1, 2, 4), (1, 4, 4)] * 2:
        graphs.run(grid, lambda: torch.zeros(1))
    assert capture.captures == 3 and list(graphs.graphs) == [(1, 2, 4), (1, 4, 4)]  # the oldest went
    graphs.clear()
    assert not graphs.graphs and not graphs.seen
    graphs.run((1, 2, 4), lambda: torch.zeros(1))
    assert capture.captures == 3  # seen once since the plan: eager


def test_a_failed_capture_turns_graphs_off_with_its_reason():
    graphs = VisionGraphs(True, 2, StandIn(fail=True))
    for _ in range(2):
        assert torch.equal(graphs.run((1, 2, 2), lambda: torch.ones(3)), torch.ones(3))
    assert not graphs.enabled and graphs.failed == "operation not permitted when stream is capturing"
    off = VisionGraphs(False, 2, StandIn())
    for _ in range(3):
        off.run((1, 2, 2), lambda: torch.ones(1))
    assert off._capture.captures == 0


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_captured_encodes_equal_the_eager_tower(artifact, dtype):
    eager = FastVisionTower.from_artifact(artifact, dtype, DEVICE, use_graphs=False)
    fast = FastVisionTower.from_artifact(artifact, dtype, DEVICE)
    fast.warm(16 * 12)
    eager.warm(16 * 12)
    eager.attention = fast.attention  # the same kernels: byte for byte
    grid = (1, 10, 4)
    for n in range(4):
        pixels = torch.randn(40, fast.cfg.patch_dim, generator=torch.Generator().manual_seed(n)).to(DEVICE)
        assert torch.equal(fast.encode(pixels, grid), eager.encode(pixels, grid)), n
    assert fast.graphs.failed is None and set(fast.graphs.graphs) == {(1, 12, 12), grid}
