"""greedy_draw vs naive (the torch draw `SpecSampler.draw_static` ran for a lean greedy variant): argmax with ties
(the first index wins, also across the kernel's blocks), a NaN (the first NaN is the token and the row is not
drawable), +inf, a row all -inf (token 0, not drawable), rows whose earlier draft failed (num < j) or without room;
vocabularies off the block size and past one block. Integer outputs: exact equality; the drafts' other columns are
poisoned and must stay untouched."""

import pytest
import torch

from _device import DEVICE
from ninfer.fast.ops.greedy_draw import greedy_draw, greedy_draw_naive


def _rows(V: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(7, V, generator=g)
    x[1, V // 3] = x[1, V - 1] = x[1].max() + 1  # a tie: the first index
    x[2, V // 2] = float("nan")
    x[2, V - 1] = float("nan")
    x[3, V - 1] = float("inf")
    x[4] = float("-inf")
    x[5, :] = 0.25  # all equal: id 0
    return x


@pytest.mark.parametrize("V", [1, 37, 4096, 9000])
@pytest.mark.parametrize("j", [0, 2])
def test_greedy_draw(V, j):
    g = torch.Generator().manual_seed(V + j)
    x = _rows(V, g).to(DEVICE)
    room = torch.tensor([3, 3, 3, 3, 3, 3, 2, 0], dtype=torch.int32, device=DEVICE)
    num0 = torch.tensor([j, j, j, j, j, j, j, j], dtype=torch.int32, device=DEVICE)
    num0[0] = max(j - 1, 0)  # an earlier draft of row 0 could not be drawn (at j = 0: every row so far could)
    out = []
    for draw in (greedy_draw, greedy_draw_naive):
        drafts = torch.full((8, 4), -7, dtype=torch.int64, device=DEVICE)
        num = num0.clone()
        token = draw(x, drafts, num, room, torch.tensor([j], device=DEVICE))
        out.append((token, drafts, num))
    (t, d, n), (wt, wd, wn) = out
    assert torch.equal(t, wt) and torch.equal(d, wd) and torch.equal(n, wn)
    assert torch.equal(d[:7, j], t) and (d[:, [c for c in range(4) if c != j]] == -7).all() and d[7, j] == -7
    if V > 1:
        assert t[1] == V // 3 and t[2] == V // 2 and t[3] == V - 1
    assert t[4] == 0 and t[5] == 0
    drawn = (n - num0).tolist()
    assert drawn[2:5] == [0, 0, 0] and drawn[5] == 1 and drawn[0] == int(j == 0) and drawn[7] == 0
