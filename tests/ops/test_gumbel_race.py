"""gumbel_race (Triton) vs gumbel_race_naive: rows of processed logits with dropped (-inf) tokens, a row with one
token left, a row with none (the lowest id), seeds over the whole 64-bit range (two's complement) and positions past
2^32, both draft and token streams. Tokens must agree exactly; the output and the workspace come poisoned (+inf
maxima, which would win every row, and -1 ids), so a block the reduction misses shows up."""

import pytest
import torch

from _device import DEVICE, ON_GPU
from ninfer.fast.ops.gumbel_race import RaceWorkspace, gumbel_race, gumbel_race_naive
from ninfer.sampling.philox import STREAM_DRAFT, STREAM_TOKEN, seed_tensor

# (B, V, block): one block wider than V, ragged last blocks, many blocks; the GPU adds the real vocabulary
SHAPES = [(1, 97, 32), (4, 1000, 128), (3, 61, 64), (5, 333, 16)] + ([(8, 248320, 2048)] if ON_GPU else [])


def _rows(B: int, V: int, gen: torch.Generator) -> torch.Tensor:
    z = 3.0 * torch.randn(B, V, generator=gen)
    z = z.masked_fill(torch.rand(B, V, generator=gen) < 0.3, float("-inf"))  # top-k/top-p/min-p drops
    if B > 1:
        z[1] = float("-inf")
        z[1, V // 2] = 0.5  # one token left: it must win
    if B > 2:
        z[2] = float("-inf")  # nothing left: the lowest id, as torch.argmax
    return z


@pytest.mark.parametrize("stream", [STREAM_DRAFT, STREAM_TOKEN])
@pytest.mark.parametrize("B,V,block", SHAPES)
def test_gumbel_race_matches_naive(B, V, block, stream):
    gen = torch.Generator().manual_seed(B * 7919 + V + stream)
    z = _rows(B, V, gen)
    seeds = seed_tensor([int(s) for s in torch.randint(0, 2 ** 62, (B,), generator=gen) * 4 + 1])
    seeds[0] = seed_tensor([2 ** 64 - 5])[0]  # a seed past 2^63: stored negative
    positions = torch.randint(0, 2 ** 40, (B,), generator=gen)
    want = gumbel_race_naive(z, seeds, positions, stream)
    ws = RaceWorkspace.allocate(B + 2, V, block, DEVICE)
    ws.smax.fill_(float("inf"))
    ws.sarg.fill_(-1)
    out = torch.full((B,), -1, dtype=torch.int64, device=DEVICE)
    got = gumbel_race(z.to(DEVICE), seeds.to(DEVICE), positions.to(DEVICE), stream, block=block, out=out,
                      workspace=ws)
    torch.testing.assert_close(got.cpu(), want)
