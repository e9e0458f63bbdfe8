"""draft_start vs naive: rows in any order (one table row twice), frontiers at a page's first and last position and
mid-page, a page size off the powers of two, a block table longer than one program's block and a page larger than
one chunk; only the first B of the outputs' rows written. Hidden and pools float (NaN-poisoned where they are
written), the rest integers checked exactly."""

import pytest
import torch

from _device import DEVICE
from ninfer.fast.ops.draft_start import draft_start, draft_start_naive
from ninfer.testing.numerics import assert_close


@pytest.mark.parametrize("max_pages,page_size,nkv,d", [(7, 5, 2, 24), (1100, 16, 4, 32)])
def test_draft_start(max_pages, page_size, nkv, d):
    R, S, H, num_pages, scratch = 5, 6, 1100, 3 * max_pages, 3
    g = torch.Generator().manual_seed(max_pages)
    tables = torch.randperm(R * max_pages, generator=g)[:R * max_pages].view(R, max_pages) % num_pages
    tables = tables.to(torch.int32).to(DEVICE)
    pool_pages = num_pages + 1 + R * scratch
    rows = torch.tensor([3, 0, 3], dtype=torch.int32, device=DEVICE)
    last = min(max_pages, 4) * page_size - 1
    frontiers = torch.tensor([page_size, last, page_size + 2], dtype=torch.int32, device=DEVICE)
    pending = torch.tensor([11, 0, 7], dtype=torch.int32, device=DEVICE)
    slot_ids = torch.tensor([5, 1, 2], dtype=torch.int32, device=DEVICE)
    stored = torch.randn(S, H, generator=g).to(DEVICE)
    outs = {}
    for name, fn in (("triton", draft_start), ("naive", draft_start_naive)):
        pools = [torch.randn(pool_pages, page_size, nkv, d, generator=torch.Generator().manual_seed(1)).to(DEVICE)
                 for _ in range(2)]
        for pool in pools:  # the scratch pages: written where a row copies its partial page, NaN elsewhere
            pool[num_pages + 1:] = float("nan")
        table = torch.full((4, max_pages), -7, dtype=torch.int32, device=DEVICE)
        hidden = torch.full((4, H), float("nan"), device=DEVICE)
        tokens = torch.full((4,), -7, dtype=torch.int64, device=DEVICE)
        positions = torch.full((4,), -7, dtype=torch.int32, device=DEVICE)
        fn(tables, rows, frontiers, pending, slot_ids, stored, *pools, table, hidden, tokens, positions, num_pages,
           scratch)
        outs[name] = (table, hidden, tokens, positions, *pools)
    (table, hidden, tokens, positions, k, v), want = outs["triton"], outs["naive"]
    assert torch.equal(table, want[0]) and torch.equal(tokens, want[2]) and torch.equal(positions, want[3])
    assert (table[3] == -7).all() and int(tokens[3]) == -7 and int(positions[3]) == -7  # rows past B untouched
    assert torch.isnan(hidden[3]).all()
    written = torch.cat([hidden[:3].flatten(), k.flatten(), v.flatten()])
    expect = torch.cat([want[1][:3].flatten(), want[4].flatten(), want[5].flatten()])
    assert torch.equal(torch.isnan(written), torch.isnan(expect))
    keep = ~torch.isnan(expect)
    assert_close("draft_start", expect[keep], written[keep], 0.0)
