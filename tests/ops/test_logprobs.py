"""logprobs (Triton) vs logprobs_naive: rank and top ids exact (ties to the lower id), values to float32 rounding;
rows that did not ask are left alone. Workspaces come NaN-poisoned. Logits sit on a coarse grid: two logits closer
than a logprob's ulp could merge into one logprob under one log-sum-exp rounding and not under another."""

import pytest
import torch

from _device import DEVICE, ON_GPU
from ninfer.fast.ops.logprobs import LogprobsWorkspace, logprobs, logprobs_naive
from ninfer.fast.ops.logprobs import layout as L

SHAPES = [(4, 1000, 128), (4, 97, 32)] + ([(8, 248320, 2048)] if ON_GPU else [])


def _compare(logits, tokens, num, block):
    B, V = logits.shape
    ws = LogprobsWorkspace.allocate(B, V, DEVICE, block_v=block)
    out = torch.full((B, L.COLUMNS), -7, dtype=torch.int32, device=DEVICE)
    ref = logprobs_naive(logits, tokens, num).cpu()
    tri = logprobs(logits, tokens, num, workspace=ws, out=out).cpu()
    for b, n in enumerate(num.tolist()):
        if n < 0:
            assert (tri[b] == -7).all(), f"row {b} did not ask but was written"
            continue
        n = min(n, V)
        assert tri[b, L.RANK] == ref[b, L.RANK]
        assert tri[b, L.TOP_IDS:L.TOP_IDS + n].tolist() == ref[b, L.TOP_IDS:L.TOP_IDS + n].tolist()
        values = tri[b].view(torch.float32)
        want = ref[b].view(torch.float32)
        assert float(values[L.CHOSEN]) == pytest.approx(float(want[L.CHOSEN]), rel=1e-5, abs=1e-5)
        assert values[L.TOP_VALUES:L.TOP_VALUES + n].tolist() == pytest.approx(
            want[L.TOP_VALUES:L.TOP_VALUES + n].tolist(), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("B,V,block", SHAPES)
def test_logprobs(B, V, block):
    gen = torch.Generator().manual_seed(V)
    # on a 2^-10 grid: equal logits tie exactly, distinct ones stay distinct logprobs whatever the last bit of the
    # log-sum-exp (each implementation rounds its own), so rank and order are exact at any V
    logits = (torch.round(4096 * torch.randn(B, V, generator=gen)) / 1024).to(DEVICE)
    tokens = torch.randint(0, V, (B,), generator=gen).to(DEVICE)
    tokens[0] = int(torch.argmax(logits[0]))
    num = torch.tensor([20, -1, 0, 3, 7, 1, 20, -1][:B], device=DEVICE)
    _compare(logits, tokens, num, block)


@pytest.mark.parametrize("B,V,block", SHAPES[:2])
def test_logprobs_ties(B, V, block):
    """Integer logits: whole classes tie, so both the rank and the top ids depend on the tie rules."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(-3, 2, (B, V), generator=gen).float().to(DEVICE)
    logits[1, 40:] = float("-inf")  # fewer finite tokens than asked for after position 40: -inf ties too
    tokens = torch.tensor([0, 45, 7, V - 1][:B], device=DEVICE)
    num = torch.tensor([20, 20, 5, 2][:B], device=DEVICE)
    _compare(logits, tokens, num, block)
