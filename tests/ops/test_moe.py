"""moe_route vs softmax/topk/renormalise, moe_align's bookkeeping, and moe_experts (grouped GEMMs + swiglu) vs the
per-token loop: odd expert counts and widths, tokens that share experts, experts nobody picked."""

import pytest
import torch

from _device import DEVICE, DOT_IO_DTYPES, IO_DTYPES, ON_GPU
from ninfer.fast.ops.moe import moe_align, moe_experts, moe_experts_naive, moe_route, moe_route_naive
from ninfer.testing.numerics import assert_close

# (T, E, k): 35B-A3B routes 256 experts top-8, 397B 512 top-10
ROUTES = [(1, 256, 8), (64, 256, 8), (5, 512, 10)] if ON_GPU else [(5, 7, 3), (3, 60, 8)]
# (T, E, k, H, I)
EXPERTS = [(1, 256, 8, 2048, 512), (8, 256, 8, 2048, 512), (64, 256, 8, 2048, 512)] if ON_GPU \
    else [(3, 7, 3, 40, 24), (6, 4, 2, 16, 70)]


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("T,E,k", ROUTES)
def test_moe_route(T, E, k, dtype):
    logits = torch.randn(T, E, device=DEVICE).to(dtype)
    w_ref, ids_ref = moe_route_naive(logits, k)
    w, ids = moe_route(logits, k)
    # bf16 logits tie often and tied experts may come in either order: compare the picked probabilities
    probs = torch.softmax(logits.float(), -1)
    assert torch.equal(probs.gather(1, ids_ref.long()), probs.gather(1, ids.long()))
    assert (ids.sort(1).values.diff(1) != 0).all()
    assert_close("moe_route.weights", w_ref, w, 1e-5)


def test_moe_align_groups_pairs_by_expert():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]], dtype=torch.int32, device=DEVICE)
    sorted_pairs, block_expert = moe_align(ids, num_experts=5, block=4)
    P = ids.numel()
    flat = ids.flatten().tolist()
    pairs, experts = sorted_pairs.view(-1, 4).tolist(), block_expert.tolist()
    seen = []
    for blk, e in zip(pairs, experts):
        real = [p for p in blk if p != P]
        assert all(flat[p] == e for p in real)
        seen += real
        if e < 0:
            assert not real
    assert sorted(seen) == list(range(P))
    assert experts[:3] == [0, 1, 3] and experts[3:] == [-1] * (len(experts) - 3)


@pytest.mark.parametrize("dtype", DOT_IO_DTYPES, ids=str)
@pytest.mark.parametrize("T,E,k,H,I", EXPERTS)
def test_moe_experts(T, E, k, H, I, dtype):
    x = torch.randn(T, H, device=DEVICE).to(dtype)
    w_gate_up = (H ** -0.5 * torch.randn(E, 2 * I, H, device=DEVICE)).to(dtype)
    w_down = (I ** -0.5 * torch.randn(E, H, I, device=DEVICE)).to(dtype)
    weights, ids = moe_route_naive(torch.randn(T, E, device=DEVICE), k)
    ref = moe_experts_naive(x, w_gate_up, w_down, weights, ids)
    out = moe_experts(x, w_gate_up, w_down, weights, ids)
    assert_close("moe_experts", ref, out, 2e-2 if dtype == torch.bfloat16 else (5e-3 if ON_GPU else 1e-5))
