"""Prefill pieces padded to a graph bucket (``FastModel.prefill_piece``, ``PrefillGraphRunner``) against the eager
prefill of the same tokens: on the Triton kernels equal byte for byte in every KV page, GDN state slot and conv
window of the pools, and in the logits (so the padding rows wrote nothing and moved no state); on the naive kernels
equal within rounding (torch's vectorised exp rounds a tensor's tail differently). On CPU the runner runs the padded
body eagerly on its static buffers; on the GPU it replays the captured graphs."""

import functools

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from _fast_setup import F, L, build_pair, place_sequences, tiny_config
from ninfer.fast.prefill_graphs import PrefillGraphRunner, prefill_buckets
from ninfer.testing.numerics import assert_close

I32 = dict(dtype=torch.int32, device=DEVICE)
# where not byte for byte: CPU rounding of the naive ops, or TF32 GEMMs of other row counts on the GPU
TOL = 1e-2 if ON_GPU else 1e-5


@functools.cache
def _built(kernels: str):
    """Two models on the same weights (a GDN and an attention layer) with the same sequences placed, the first
    with a 30-token prefix prefilled; and a copy of their pools then."""
    twins = []
    for _ in range(2):
        pair = build_pair(tiny_config(layers=(L, F)), torch.float32, kernels, max_context=256, page_size=8,
                          max_prefill_tokens=128)
        slots, rows = place_sequences(pair.fast, 2)
        prefix = torch.randint(1, 60, (30,), generator=torch.Generator().manual_seed(1)).to(DEVICE)
        pair.fast.prefill(prefix, slots[0], rows[0], 0)
        twins.append((pair.fast, slots, rows))
    return twins, [[t.clone() for t in _state(m)] for m, _, _ in twins]


def _state(model) -> tuple[torch.Tensor, ...]:
    return model.pools.k, model.pools.v, model.pools.conv, model.pools.ssm


def _twins(kernels: str):
    twins, saved = _built(kernels)
    for (model, _, _), tensors in zip(twins, saved):
        for live, copy in zip(_state(model), tensors):
            live.copy_(copy)
    return twins


def _pools_equal(a, b, exact: bool) -> None:
    for name in ("k", "v", "conv", "ssm"):
        x, y = getattr(a.pools, name), getattr(b.pools, name)
        if exact:
            assert torch.equal(x, y), name
        else:
            assert_close(f"pools.{name}", x, y, TOL)


# (kernels, real tokens, bucket, start): a short last GDN chunk and one wholly of padding, one real token, a fresh
# sequence (its slot reset by the caller)
CASES = [("triton", 37, 128, 30), ("triton", 20, 64, 0), ("naive", 1, 64, 30), ("naive", 37, 128, 30)]


@pytest.mark.parametrize("kernels,n,bucket,start", CASES)
def test_padded_piece_equals_the_eager_prefill(kernels, n, bucket, start):
    (eager, slots, rows), (padded, _, _) = _twins(kernels)
    tokens = torch.randint(1, 60, (n,), generator=torch.Generator().manual_seed(n)).to(DEVICE)
    ref = eager.prefill(tokens, slots[0], rows[0], start)
    if start == 0:  # the caller's reset (host-known): prefill_piece itself never resets
        padded.pools.reset_slot(slots[0])
    # the padding rows hold a real token id: only the length says they are padding
    ids = torch.full((bucket,), 5, **I32)
    ids[:n] = tokens
    out = padded.prefill_piece(ids, torch.tensor([slots[0]], **I32), torch.tensor([rows[0]], **I32),
                               torch.tensor([start], **I32), torch.tensor([n], **I32))
    # cuBLAS may pick another GEMM for another row count, as torch's CPU mm does for one row (a GEMV)
    exact = kernels == "triton" and not ON_GPU and n > 1
    if exact:
        assert torch.equal(out[0], ref)
    else:
        assert_close("prefill_piece.logits", ref, out[0], TOL)
    _pools_equal(eager, padded, exact)


def test_runner_picks_the_bucket_and_resets_at_position_zero():
    # the runner's own logic (the kernels are above); a capture takes the Triton kernels (the naive ones read the
    # device length back)
    (eager, slots, rows), (padded, _, _) = _twins("triton" if ON_GPU else "naive")
    runner = PrefillGraphRunner(padded, 512)
    runner.capture()  # on the GPU: the replays below are the graphs'; on a CPU nothing (the same body eagerly)
    _twins("triton" if ON_GPU else "naive")  # the capture wrote the padded twin's dummy page and slot: both restored
    assert len(runner.graphs) == (2 if ON_GPU else 0)
    assert runner.buckets == (64, 128) == prefill_buckets(512, 128, 256)  # the plan's piece caps them
    assert [runner.bucket(n) for n in (1, 64, 65, 128, 129)] == [64, 64, 128, 128, None]
    tokens = [int(t) for t in torch.randint(1, 60, (90,), generator=torch.Generator().manual_seed(4))]
    for start, piece in ((0, tokens[:70]), (70, tokens[70:])):  # the slot's earlier state is overwritten at 0
        ref = eager.prefill(torch.tensor(piece, device=DEVICE), slots[1], rows[1], start)
        out = runner.run(piece, slots[1], rows[1], start)
        assert_close("runner.logits", ref, out, TOL)
    _pools_equal(eager, padded, False)
    with pytest.raises(ValueError, match="1..128"):
        runner.run(tokens[:1] * 129, slots[1], rows[1], 0)


def test_buckets_stop_at_the_piece_and_the_context():
    assert prefill_buckets(512, 8192, 8192) == (64, 128, 256, 512)
    assert prefill_buckets(300, 8192, 8192) == (64, 128, 256)
    assert prefill_buckets(512, 8192, 200) == (64, 128)
    assert prefill_buckets(512, 8192, 63) == () and prefill_buckets(0, 8192, 8192) == ()


@pytest.mark.parametrize("timed,want_s,want_fixed", [((1e-3, 1.64e-3), (1e-3, 1.64e-3), 0.36e-3),
                                                     ((2e-3, 1.5e-3), (2e-3, 2e-3), 2e-3)])
def test_graph_costs_fit_the_graphed_fixed_cost(timed, want_s, want_fixed):
    """PrefillCosts' graph terms from each bucket's run on the dummy slot and row (the timer faked): the times made
    non-decreasing (a noisy longer bucket never predicts faster), the fixed cost the intercept through the two
    largest buckets."""
    from ninfer.fast.program.costs import graph_costs

    (_, _, _), (padded, _, _) = _twins("naive")
    runner, times, ran = PrefillGraphRunner(padded, 512), iter(timed), []
    buckets, piece_s, fixed = graph_costs(runner, 5e-6, lambda fn: (ran.append(fn()), next(times))[1])
    assert buckets == (64, 128) and len(ran) == 2 and all(r.shape == (padded.cfg.vocab_size,) for r in ran)
    assert piece_s == pytest.approx(want_s) and fixed == pytest.approx(want_fixed)
