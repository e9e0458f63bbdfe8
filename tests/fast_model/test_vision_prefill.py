"""The fast model's image prefill against the reference model: image feature rows in place of the pad embeddings
and 3-row MRoPE positions (the Frontend's construction, one image of 3 x 4 merged tokens), the prompt in one piece
and in 64-token pieces with the image across the cut; every token's logits in fp32."""

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from _fast_setup import build_pair, place_sequences, tiny_config
from ninfer.contracts.media import PromptImage
from ninfer.frontend.vision_prompt import mrope_positions
from ninfer.testing.numerics import assert_close

FP32_TOL = 1e-3 if ON_GPU else 1e-5  # the GPU's fp32 GEMMs round as TF32 (3e-4 measured on the H200)


@pytest.mark.parametrize("offset", [10, 58], ids=["one-piece-image", "image-across-pieces"])
def test_image_prefill_matches_the_reference(offset):
    kernels = "triton" if ON_GPU else "naive"
    pair = build_pair(tiny_config(), torch.float32, kernels, max_context=160, max_prefill_tokens=100)
    slots, rows = place_sequences(pair.fast, 1)
    T = 150
    img = PromptImage(offset=offset, grid=(1, 6, 8), merge=2, digest="00" * 16, pixels=None)  # 12 tokens
    positions, delta = mrope_positions(T, [img])
    assert delta < 0  # the image's 12 tokens advance the positions by max(3, 4) = 4
    tokens = torch.randint(0, pair.cfg.vocab_size, (T,))
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(img.tokens, pair.cfg.hidden_size, generator=g) * 0.05
    rows_ = torch.arange(img.offset, img.end)
    pos = torch.from_numpy(positions)
    out = pair.fast.prefill(tokens.to(DEVICE), slots[0], rows[0], 0, all_logits=True,
                            rope_positions=pos.to(DEVICE, torch.int32), embeds=(rows_.to(DEVICE), feats.to(DEVICE)))
    ref = pair.ref.prefill(tokens, pair.ref.new_state(), positions=pos, embeds=(rows_, feats))
    assert_close("image prefill logits", ref, out, FP32_TOL)
    plain = pair.ref.prefill(tokens, pair.ref.new_state())
    assert (ref - plain).abs().max() > 1e-3  # the image rows and positions matter
