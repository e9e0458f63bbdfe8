"""dflash_walk (DFlash2's greedy selector walk in one launch) against its naive definition on awkward shapes (K and
rank not powers of two, rows with less room, repeated candidates across slots), with poisoned outputs and slots whose
scores tie, are all -inf, +inf or NaN; and the naive walk against the slot-by-slot draws it replaces
(`SpecSampler.draw_static` over `dflash_select`'s scattered scores)."""

from pathlib import Path

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.dflash_select import dflash_select_naive
from ninfer.fast.ops.dflash_walk import dflash_walk, dflash_walk_naive
from ninfer.testing.sm90 import run_build_script

# (rows, drafts k, K, rank, vocab): the published top-16 at rank 256 over the 248,320-token vocabulary on the GPU
SHAPES = [(8, 15, 16, 256, 248320), (3, 7, 16, 256, 248320)] if ON_GPU else [(3, 5, 5, 12, 50), (1, 7, 16, 8, 40),
                                                                            (4, 3, 3, 7, 9)]


def _inputs(R, k, K, r, V, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    unary = (3 * torch.randn(R, k, K, generator=g)).float()
    cand = torch.stack([torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(k)]) for _ in range(R)])
    proj = torch.randn(R, k, r, generator=g).to(dtype)
    pred, succ = (torch.randn(V, r, generator=g).to(dtype) for _ in range(2))
    anchor = torch.randint(0, V, (R,), generator=g)
    room = torch.tensor([k - (i % 3) for i in range(R)], dtype=torch.int32)
    return [t.to(DEVICE) for t in (unary, cand, proj, anchor, pred, succ, room)]


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("R,k,K,r,V", SHAPES)
def test_dflash_walk(R, k, K, r, V, dtype):
    unary, cand, proj, anchor, pred, succ, room = _inputs(R, k, K, r, V, dtype)
    # slot 1 of row 0: every candidate at one score (ties to the lowest id); row R-1's slot 2 all -inf (not
    # drawable: its walk goes on from id 0); row 1's slot 0 a NaN, its slot 1 a +inf (neither drawable)
    unary[0, 1] = 1e30
    unary[-1, min(2, k - 1)] = float("-inf")
    if R > 1:
        unary[1, 0, K // 2] = float("nan")
        unary[1, 1, 0] = float("inf")
    want = dflash_walk_naive(unary, cand, proj, anchor, pred, succ, room)
    drafts = torch.full((R, k), -7, dtype=torch.long, device=DEVICE)  # poisoned: every slot must be written
    num = torch.full((R,), -7, dtype=torch.int32, device=DEVICE)
    got = dflash_walk(unary, cand, proj, anchor, pred, succ, room, drafts, num)
    assert got[0] is drafts and got[1] is num
    assert torch.equal(drafts, want[0]) and torch.equal(num, want[1]), (drafts, want[0], num, want[1])
    assert int(want[0][0, 1]) == int(cand[0, 1].min())  # the tie went to the lowest id
    if R > 1:
        assert int(want[1][1]) == 0  # its first slot was not drawable


def test_naive_walk_equals_the_slot_by_slot_draws():
    """The definition against what the draft graphs ran before it: per slot, `dflash_select`'s scores scattered
    into a -inf row and drawn by `SpecSampler.draw_static` on a lean greedy variant."""
    from ninfer.fast.sampling import DeviceSampler
    from ninfer.fast.sampling.draw_variants import LEAN, draw_steps
    from ninfer.fast.sampling.rows import GREEDY
    from ninfer.fast.sampling.spec import SpecSampler
    from ninfer.fast.sampling.static_draws import StaticDraws

    R, k, K, r, V = 3, 5, 4, 6, 30
    unary, cand, proj, anchor, pred, succ, room = (t.cpu() for t in _inputs(R, k, K, r, V, torch.float32, seed=4))
    unary[2, 1] = float("-inf")
    spec = SpecSampler(DeviceSampler(V, R, R, "cpu", kernels="naive"), k)
    d = StaticDraws(R, k, V, torch.device("cpu"))
    d.fill_dummy(R, GREEDY, spec.tables.dummy_row)
    d.room[:R].copy_(room)
    d.reset(R)
    prev = anchor
    for j in range(k):
        scores = dflash_select_naive(unary[:, j], cand[:, j], proj[:, j], prev, pred, succ)
        z = torch.full((R, V), float("-inf")).scatter_(1, cand[:, j], scores)
        prev = spec.draw_static(d, R, draw_steps(GREEDY + LEAN), z)
    drafts, num = dflash_walk_naive(unary, cand, proj, anchor, pred, succ, room)
    assert torch.equal(drafts, d.drafts[:R]) and torch.equal(num, d.num[:R]), (drafts, d.drafts, num, d.num)
    assert num.tolist() == [5, 4, 1]  # row 2 stops at its all -inf slot 1


def test_sm90_build():
    # Hopper's compile on the CPU (Triton's ptxas, a subprocess without the interpreter): the published selector's
    # walk builds for sm_90 without spills (bf16 codebooks: 112 registers)
    rows = run_build_script(Path(__file__).with_name("_sm90_dflash_walk.py"), ["bf16", "fp32"])
    assert len(rows) == 2
    for r in rows:
        assert r["spill"] == 0, r
