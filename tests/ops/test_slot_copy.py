"""slot_copy vs naive on odd slot sizes and both pool dtypes: the listed slots copied, every other slot untouched."""

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.slot_copy import slot_copy, slot_copy_naive

# (layers, slots, slot shape): the 9B GDN state slot and conv window on the GPU
SHAPES = [(3, 20, (32, 128, 128)), (2, 20, (8192, 3))] if ON_GPU else [(3, 9, (5, 7)), (2, 6, (63,))]


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("L,S,slot", SHAPES)
def test_slot_copy(L, S, slot, dtype):
    pool = torch.randn(L, S, *slot, device=DEVICE).to(dtype)
    src = torch.tensor([1, 0, 2], dtype=torch.int32, device=DEVICE)
    dst = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)  # + offset 3: slots 3, 4, 5
    want = pool.clone()
    slot_copy_naive(want, src, dst, dst_offset=3)
    got = pool.clone()
    slot_copy(got, src, dst, dst_offset=3)
    assert torch.equal(got, want)  # a copy is exact
    assert all(torch.equal(got[:, d], pool[:, s]) for s, d in ((1, 3), (0, 4), (2, 5)))
    assert torch.equal(got[:, :3], pool[:, :3]) and torch.equal(got[:, 6:], pool[:, 6:])


def test_slot_copy_of_a_stage_without_gdn_layers_is_a_no_op():
    """A pipeline stage that owns no GDN layer holds a (0, S, ...) pool; its backup copy launches nothing."""
    pool = torch.empty(0, 9, 4, 3, device=DEVICE)
    ids = torch.tensor([8, 8], dtype=torch.int32, device=DEVICE)
    slot_copy(pool, ids, ids, dst_offset=0)
    slot_copy_naive(pool, ids, ids, dst_offset=0)
    assert pool.shape == (0, 9, 4, 3)
