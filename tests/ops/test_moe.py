"""moe_route vs softmax/topk/renormalise, moe_align's bookkeeping, and moe_experts (grouped GEMMs with the fused
swiglu epilogue, the slot-order combine) vs the per-token loop: odd expert counts and widths, tokens that share
experts, experts nobody picked, decode-sized and prefill-sized (64-row blocks) batches."""

import pytest
import torch

from _device import DEVICE, DOT_IO_DTYPES, IO_DTYPES, ON_GPU
from ninfer.fast.ops.moe import moe_align, moe_experts, moe_experts_naive, moe_route, moe_route_naive
from ninfer.testing.numerics import assert_close

# (T, E, k): 35B-A3B routes 256 experts top-8, 397B 512 top-10
ROUTES = [(1, 256, 8), (64, 256, 8), (5, 512, 10)] if ON_GPU else [(5, 7, 3), (3, 60, 8)]
# (T, E, k, H, I)
EXPERTS = [(1, 256, 8, 2048, 512), (8, 256, 8, 2048, 512), (64, 256, 8, 2048, 512)] if ON_GPU \
    else [(3, 7, 3, 40, 24), (6, 4, 2, 16, 70), (90, 6, 3, 16, 24)]  # the last: > 256 pairs, prefill blocks


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


def _check_alignment(ids, sorted_pairs, block_expert, block):
    # every pair exactly once, each block holds pairs of its expert only, in pair order, empty blocks past the end
    P = ids.numel()
    flat = ids.flatten().tolist()
    seen = []
    for blk, e in zip(sorted_pairs.view(-1, block).tolist(), block_expert.tolist()):
        real = [p for p in blk if p != P]
        assert all(flat[p] == e for p in real) and real == sorted(real)
        assert blk[:len(real)] == real
        seen += real
        if e < 0:
            assert not real
    assert sorted(seen) == list(range(P))
    used = sorted(set(flat))
    assert [e for e in block_expert.tolist() if e >= 0] == sorted(
        sum([[e] * -(-flat.count(e) // block) for e in used], []))


def test_moe_align_small_example():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]], dtype=torch.int32, device=DEVICE)
    sorted_pairs, block_expert = moe_align(ids, num_experts=5, block=4)
    _check_alignment(ids, sorted_pairs, block_expert, 4)
    assert block_expert.tolist()[:3] == [0, 1, 3]


@pytest.mark.parametrize("T,E,k", [(1, 256, 8), (8, 64, 8), (37, 512, 10), (3, 5, 4)],
                         ids=["decode", "many_per_expert", "torch_path", "tiny"])
def test_moe_align(T, E, k):
    # top-k ids without repeats per token, as routing produces
    ids = torch.rand(T, E, device=DEVICE).topk(k, dim=-1).indices.to(torch.int32)
    _check_alignment(ids, *moe_align(ids, E), 16)


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
