"""decode_slots vs naive: the rows' block tables (in any order, a row twice) and their tokens' flat KV slots at page
edges, with a block table longer than one program's block and a page size off the powers of two. The outputs are
integers, which NaN poisoning does not reach: exact equality with the naive form is the check."""

import pytest
import torch

from _device import DEVICE
from ninfer.fast.ops.decode_slots import decode_slots, decode_slots_naive


@pytest.mark.parametrize("max_pages,page_size", [(7, 5), (1500, 16), (1, 4)])
def test_decode_slots(max_pages, page_size):
    R = 6
    g = torch.Generator().manual_seed(max_pages)
    tables = torch.randperm(R * max_pages, generator=g).view(R, max_pages).to(torch.int32).to(DEVICE)
    rows = torch.tensor([4, 0, 5, 4], dtype=torch.int32, device=DEVICE)
    last = max_pages * page_size - 1
    positions = torch.tensor([0, page_size - 1, min(page_size, last), last], dtype=torch.int32, device=DEVICE)
    table, slots = decode_slots(tables, rows, positions, page_size)
    want_table, want_slots = decode_slots_naive(tables, rows, positions, page_size)
    assert table.dtype == want_table.dtype and slots.dtype == want_slots.dtype
    assert torch.equal(table, want_table) and torch.equal(slots, want_slots)
    assert torch.equal(table[0], tables[4]) and int(slots[3]) == int(tables[4, -1]) * page_size + page_size - 1
