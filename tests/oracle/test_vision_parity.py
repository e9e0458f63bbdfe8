"""The reference vision tower against transformers' Qwen3_5VisionModel on tiny random towers transformers wrote:
odd grids (smaller and larger than the learned 6x6 position table, non-square), several images in one call, a
two-frame video grid; fp32 within relative RMS 1e-5; fp64 within 1e-7 (transformers computes the rotary angles and
the resampling weights in fp32 even for an fp64 model)."""

from __future__ import annotations

import pytest
import torch

from ninfer.convert.convert import convert_checkpoint
from ninfer.models.qwen3_5.params import TEXT, VISION
from ninfer.reference.vision import VisionTower
from ninfer.reference.weights import load_weights
from ninfer.testing.checkpoints import load_hf_vlm, make_hf_checkpoint
from oracle.metrics import rel_rms

# (t, h, w) patch grids: one merge block, a tall and a wide odd grid, a grid larger than the table, a video.
GRIDS = [(1, 2, 2), (1, 10, 4), (1, 6, 14), (1, 16, 12), (2, 4, 6)]


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def tower_pair(request, tmp_path_factory):
    moe = request.param
    ckpt = make_hf_checkpoint(tmp_path_factory.mktemp("vis") / "ck", moe=moe, multimodal=True, seed=3 + moe)
    art = convert_checkpoint(ckpt, ckpt.parent / "m.ninfer", progress=False)
    return ckpt, art


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-7)])
def test_tower_matches_transformers(tower_pair, dtype, tol):
    ckpt, art = tower_pair
    hf = load_hf_vlm(ckpt, dtype)
    weights = load_weights(art, features=(TEXT, VISION), dtype=dtype)
    tower = VisionTower(hf_vision_config(art), weights, dtype)
    g = torch.Generator().manual_seed(0)
    pixels = [torch.randn(t * h * w, tower.cfg.patch_dim, generator=g, dtype=dtype) for t, h, w in GRIDS]
    with torch.no_grad():
        want = hf.model.visual(torch.cat(pixels), grid_thw=torch.tensor(GRIDS)).pooler_output
    got = torch.cat([tower.encode(p, grid) for p, grid in zip(pixels, GRIDS)])
    assert got.shape == want.shape == (sum(t * h * w for t, h, w in GRIDS) // 4, 64)
    assert rel_rms(got, want) < tol


def test_each_image_is_encoded_alone(tower_pair):
    """Attention never crosses images or frames: an image's features do not depend on its neighbours."""
    _, art = tower_pair
    tower = VisionTower(hf_vision_config(art), load_weights(art, features=(TEXT, VISION)))
    g = torch.Generator().manual_seed(1)
    frames = torch.randn(2 * 24, tower.cfg.patch_dim, generator=g)
    video = tower.encode(frames, (2, 4, 6))
    assert torch.allclose(video[:6], tower.encode(frames[:24], (1, 4, 6)), atol=1e-6)
    assert torch.allclose(video[6:], tower.encode(frames[24:], (1, 4, 6)), atol=1e-6)


def test_bad_inputs_are_refused(tower_pair):
    _, art = tower_pair
    tower = VisionTower(hf_vision_config(art), load_weights(art, features=(TEXT, VISION)))
    with pytest.raises(ValueError, match="merge blocks"):
        tower.encode(torch.zeros(15, tower.cfg.patch_dim), (1, 3, 5))
    with pytest.raises(ValueError, match="expected \\[24, 1536\\]"):
        tower.encode(torch.zeros(24, 10), (1, 4, 6))
    weights = load_weights(art, features=(TEXT, VISION))
    weights["visual.pos_embed.weight"] = weights["visual.pos_embed.weight"][:-1]
    with pytest.raises(ValueError, match="visual.pos_embed.weight"):
        VisionTower(hf_vision_config(art), weights)


def hf_vision_config(art):
    from ninfer.artifact import open_artifact

    with open_artifact(art) as a:
        return a.config.vision
