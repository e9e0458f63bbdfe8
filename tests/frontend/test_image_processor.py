"""The image processor against transformers' Pillow-backed Qwen2VLImageProcessor configured as Qwen3.5 is: pixels
bit-identical and the same grid, over odd sizes, sizes below min_pixels and above max_pixels, and image modes
(RGBA composited on white, greyscale, palette with transparency); the refusals name the image's fault."""

from __future__ import annotations

import numpy as np
import pytest

PIL = pytest.importorskip("PIL.Image")

from ninfer.frontend.image_processor import (ImageProcessorConfig, ImageRejected, process_image,  # noqa: E402
                                             smart_resize)
from ninfer.models.qwen3_5.config import Qwen35Config  # noqa: E402
from ninfer.testing.checkpoints import TINY_PREPROCESSOR, tiny_config  # noqa: E402

VISION = tiny_config(multimodal=True).vision


def _hf(pre: dict):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(**{k: v for k, v in pre.items() if k != "image_processor_type"})


def _image(w: int, h: int, mode: str, seed: int):
    rng = np.random.RandomState(seed)
    if mode == "L":
        return PIL.fromarray(rng.randint(0, 256, (h, w), dtype=np.uint8), "L")
    if mode == "P":
        img = PIL.fromarray(rng.randint(0, 256, (h, w, 3), dtype=np.uint8)).convert("P")
        img.info["transparency"] = 3
        return img
    bands = 4 if mode == "RGBA" else 3
    return PIL.fromarray(rng.randint(0, 256, (h, w, bands), dtype=np.uint8), mode)


@pytest.mark.parametrize("w, h, mode", [(131, 77, "RGB"), (20, 9, "RGB"), (1000, 333, "RGB"), (64, 64, "RGBA"),
                                        (45, 199, "L"), (97, 61, "P"), (3000, 40, "RGB")])
def test_pixels_and_grid_equal_transformers(w, h, mode):
    import json

    cfg = ImageProcessorConfig.from_json(json.dumps(TINY_PREPROCESSOR), VISION)
    img = _image(w, h, mode, w * h)
    ours = process_image(cfg, img)
    theirs = _hf(TINY_PREPROCESSOR)(images=[img], return_tensors="np")
    assert ours.grid == tuple(theirs["image_grid_thw"][0])
    assert ours.pixels.dtype == np.float32 and np.array_equal(ours.pixels, theirs["pixel_values"])
    t, gh, gw = ours.grid
    if max(w, h) < 20 * min(w, h):  # a very thin image keeps one 32-pixel row and may exceed max_pixels (as HF)
        assert TINY_PREPROCESSOR["size"]["shortest_edge"] <= gh * gw * 256 <= TINY_PREPROCESSOR["size"]["longest_edge"]
    assert ours.num_tokens == gh * gw // 4


def test_released_constants_and_digest_identity():
    cfg = ImageProcessorConfig.from_json(None, VISION)
    assert (cfg.min_pixels, cfg.max_pixels, cfg.factor, cfg.image_mean) == (65536, 16777216, 32, (0.5, 0.5, 0.5))
    assert process_image(cfg, _image(300, 200, "RGB", 1)).grid == (1, 14, 20)  # scaled up to 65536 pixels
    a = process_image(cfg, _image(300, 200, "RGB", 1))
    assert process_image(cfg, _image(300, 200, "RGB", 1)).digest == a.digest
    other = np.asarray(_image(300, 200, "RGB", 1)).copy()
    other[0, 0, 0] ^= 1
    assert process_image(cfg, PIL.fromarray(other)).digest != a.digest


def test_smart_resize_bounds_and_refusals():
    assert smart_resize(77, 131, 32, 4096, 49152) == (64, 128)
    assert smart_resize(9, 20, 32, 4096, 49152) == (64, 96)  # scaled up to reach min_pixels
    h, w = smart_resize(4000, 3000, 32, 4096, 49152)
    assert h % 32 == w % 32 == 0 and h * w <= 49152
    with pytest.raises(ImageRejected, match="aspect ratio over 200"):
        smart_resize(1, 201, 32, 4096, 49152)
    with pytest.raises(ImageRejected, match="empty"):
        smart_resize(0, 5, 32, 4096, 49152)


def test_processor_geometry_must_match_the_tower():
    import json

    with pytest.raises(ValueError, match="differ from the tower"):
        ImageProcessorConfig.from_json(json.dumps(dict(TINY_PREPROCESSOR, patch_size=14)), VISION)
    assert isinstance(VISION, type(Qwen35Config.from_dict(tiny_config(multimodal=True).to_dict()).vision))
