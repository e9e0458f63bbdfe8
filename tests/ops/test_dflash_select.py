"""dflash_select vs naive on awkward shapes (K and rank not powers of two, repeated and extreme token ids), and the
naive form against the reference selector's scores."""

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.dflash_select import dflash_select, dflash_select_naive
from ninfer.testing.numerics import assert_close

# (rows, K, rank, vocab): the published top-16 at rank 256 over the 248,320-token vocabulary on the GPU
SHAPES = [(8, 16, 256, 248320), (3, 16, 256, 248320)] if ON_GPU else [(3, 5, 12, 50), (1, 16, 8, 20), (5, 3, 7, 9)]


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("rows,K,rank,V", SHAPES)
def test_dflash_select(rows, K, rank, V, dtype):
    unary = (3 * torch.randn(rows, K, device=DEVICE)).float()
    cand = torch.randint(0, V, (rows, K), device=DEVICE)
    cand[0, -1] = V - 1
    proj = torch.randn(rows, rank, device=DEVICE).to(dtype)
    prev = torch.randint(0, V, (rows,), device=DEVICE)
    prev[-1] = cand[0, 0]  # a predecessor that is also a candidate
    pred, succ = (torch.randn(V, rank, device=DEVICE).to(dtype) for _ in range(2))
    assert_close("dflash_select", dflash_select_naive(unary, cand, proj, prev, pred, succ),
                 dflash_select(unary, cand, proj, prev, pred, succ), 1e-5)


def test_naive_equals_the_reference_selector():
    from ninfer.reference.dflash_selector import CandidateSelector
    from ninfer.reference.scope import Scope

    V, H, r = 30, 16, 6
    w = {"s.hidden_projection.weight": torch.randn(r, H), "s.predecessor_codebook": torch.randn(V, r),
         "s.successor_codebook": torch.randn(V, r)}
    logits, hidden = torch.randn(4, V), torch.randn(4, H)
    sel = CandidateSelector(Scope(w, "s"), 5, logits, hidden)
    prev = torch.tensor([3, 29, 0, 3])
    got = dflash_select_naive(sel.unary, sel.cand, sel.proj, prev, w["s.predecessor_codebook"],
                              w["s.successor_codebook"])
    want = torch.stack([sel.scores(j, int(prev[j]))[sel.cand[j]] for j in range(4)])
    assert_close("dflash_select_naive", want, got, 1e-6)
