"""The device DFlash / DFlash2 drafter (ninfer.fast.model.dflash) against the reference drafter on the same
weights: the context written into scrambled pages in pieces (a prefill chunk, a decode step, a verified block), then
one block pass whose own K/V go to a scratch page past the frontier; the drafts' logits and hidden match, and no page
outside the written positions changes."""

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from ninfer.fast.model.dflash import FastDrafter, load_drafter_weights
from ninfer.fast.model.kernels import get_kernels
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.drafter import DrafterConfig
from ninfer.reference.dflash import Drafter
from ninfer.testing.drafters import drafter_hf_config, drafter_tensors
from ninfer.testing.numerics import assert_close

V, H, PS = 50, 32, 4
CASES = [pytest.param("naive", id="naive"), pytest.param("triton", id="triton")]


def _target() -> Qwen35Config:
    return Qwen35Config.from_hf(dict(
        model_type="qwen3_5_text", vocab_size=V, hidden_size=H, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, intermediate_size=32, tie_word_embeddings=False))


@pytest.mark.parametrize("kernels", CASES)
@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_fast_drafter_equals_the_reference(kind, kernels):
    cfg = DrafterConfig.from_hf(drafter_hf_config(_target(), kind, layers=2, block_size=8))
    w = drafter_tensors(cfg, seed=3)
    g = torch.Generator().manual_seed(4)
    embed, head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    ref = Drafter(cfg, w, embed, head, torch.float32)
    fast = FastDrafter(cfg, load_drafter_weights(cfg, w.__getitem__, torch.float32, DEVICE), get_kernels(kernels),
                       embed.to(DEVICE), head.to(DEVICE))
    taps = torch.randn(11, len(cfg.target_layer_ids) * H, generator=g)
    shape = (9, PS, cfg.num_key_value_heads, cfg.head_dim)
    k_pages = [torch.randn(shape, device=DEVICE) for _ in range(cfg.num_hidden_layers)]
    v_pages = [torch.randn(shape, device=DEVICE) for _ in range(cfg.num_hidden_layers)]
    before = [p.clone() for p in k_pages]
    table = torch.tensor([6, 2, 8, 0, 5], dtype=torch.int32, device=DEVICE)  # positions 0..19: context + block
    ctx = ref.empty_context()
    for lo, hi in ((0, 7), (7, 8), (8, 11)):
        ref.extend(ctx, taps[lo:hi], lo, None)
        pos = torch.arange(lo, hi, device=DEVICE, dtype=torch.int32)
        slots = table[(pos // PS).long()].long() * PS + (pos % PS).long()
        fast.extend(taps[lo:hi].to(DEVICE), pos, slots, k_pages, v_pages)
    want_logits, want_hidden = ref.block(ctx, anchor=7, block_size=8)
    logits, hidden = fast.block([7], [11], table[None], 8, k_pages, v_pages)
    logits, hidden = logits[0], hidden[0]
    tol = 1e-2 if ON_GPU else 1e-5
    assert_close("drafter logits", want_logits, logits, tol)
    assert_close("drafter hidden", want_hidden, hidden, tol)
    for layer, (kp, old) in enumerate(zip(k_pages, before)):
        for page in (1, 3, 4, 7):  # pages outside the table are never touched
            assert torch.equal(kp[page], old[page]), (layer, page)
        ctx_k = torch.cat([kp[int(p)] for p in table])[:11].transpose(0, 1)  # [nkv, 11, d]
        assert_close("context keys", ctx.kv[layer].k, ctx_k, tol)


@pytest.mark.parametrize("kernels", CASES)
@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_batched_blocks_with_a_window_equal_the_reference(kind, kernels):
    """Two rows in one block pass, at different frontiers (one mid-page), the second under a draft window (the
    reference keeps its last 5 positions; the fast pass bounds the first key): each row's logits and hidden equal
    the reference drafter's on that row's context alone."""
    cfg = DrafterConfig.from_hf(drafter_hf_config(_target(), kind, layers=2, block_size=4))
    w = drafter_tensors(cfg, seed=5)
    g = torch.Generator().manual_seed(6)
    embed, head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    ref = Drafter(cfg, w, embed, head, torch.float32)
    fast = FastDrafter(cfg, load_drafter_weights(cfg, w.__getitem__, torch.float32, DEVICE), get_kernels(kernels),
                       embed.to(DEVICE), head.to(DEVICE))
    shape = (12, PS, cfg.num_key_value_heads, cfg.head_dim)
    k_pages = [torch.randn(shape, device=DEVICE) for _ in range(cfg.num_hidden_layers)]
    v_pages = [torch.randn(shape, device=DEVICE) for _ in range(cfg.num_hidden_layers)]
    tables = torch.tensor([[3, 9, 1, 0], [7, 2, 11, 5]], dtype=torch.int32, device=DEVICE)  # 16 positions each
    frontiers, windows, anchors = [6, 9], [None, 5], [4, 11]
    want = []
    for row, (n, window) in enumerate(zip(frontiers, windows)):
        taps = torch.randn(n, len(cfg.target_layer_ids) * H, generator=g)
        ctx = ref.empty_context()
        ref.extend(ctx, taps, 0, window)
        pos = torch.arange(n, device=DEVICE, dtype=torch.int32)
        slots = tables[row][(pos // PS).long()].long() * PS + (pos % PS).long()
        fast.extend(taps.to(DEVICE), pos, slots, k_pages, v_pages)
        want.append(ref.block(ctx, anchor=anchors[row], block_size=4))
    logits, hidden = fast.block(anchors, frontiers, tables, 4, k_pages, v_pages,
                                [0 if w_ is None else max(0, f - w_) for f, w_ in zip(frontiers, windows)])
    tol = 1e-2 if ON_GPU else 1e-5
    for row, (want_logits, want_hidden) in enumerate(want):
        assert_close(f"row {row} drafter logits", want_logits, logits[row], tol)
        assert_close(f"row {row} drafter hidden", want_hidden, hidden[row], tol)
