"""FastModel's target taps (what a DFlash drafter conditions on): every layer's output from a prefill in two pieces
and from a verified block equals the reference model's taps over the same tokens (the last layer's final-normed)."""

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from _fast_setup import build_pair, place_sequences, tiny_config
from ninfer.testing.numerics import assert_close

TOL = 1e-2 if ON_GPU else 1e-4


@pytest.mark.parametrize("kernels", ["naive", "triton"])
def test_taps_equal_the_reference(kernels):
    pair = build_pair(tiny_config(), torch.float32, kernels, max_context=160, max_prefill_tokens=64)
    (slot,), (row,) = place_sequences(pair.fast, 1)
    gen = torch.Generator().manual_seed(2)
    prompt, block = torch.randint(0, 64, (70,), generator=gen), torch.randint(0, 64, (3,), generator=gen)
    taps, want = {}, {}
    pair.fast.prefill(prompt.to(DEVICE), slot, row, 0, taps=taps)  # pieces of 64 and 6
    st = pair.ref.new_state()
    pair.ref.prefill(prompt, st, taps=want)
    assert sorted(taps) == list(range(pair.cfg.num_hidden_layers))
    for i in taps:
        assert_close(f"prefill tap {i}", want[i], taps[i], TOL)
    taps, want = {}, {}
    pair.fast.verify(block.to(DEVICE), [slot], [row], [70], [3], taps=taps)
    pair.ref.prefill(block, st, chunked=False, taps=want)
    for i in want:
        assert_close(f"verify tap {i}", want[i], taps[i], TOL)
