"""The Qwen3.5 image processor (transformers' ``Qwen2VLImageProcessor`` as Qwen3.5 configures it), numpy + Pillow.

One image -> its flattened patches for the vision tower and its patch grid:

1. ``smart_resize``: both sides to multiples of ``factor`` = patch x merge (32), as close to the original aspect as
   rounding allows, scaled down (floor) when the area exceeds ``max_pixels`` and up (ceil) when below
   ``min_pixels``; an aspect ratio over 200 is refused.
2. RGB (transparency composited onto white), Pillow resize with the configured filter (bicubic), then ``x * rescale_factor`` (1/255),
   (in fp64, rounded to fp32) then ``(x - mean) / std`` per channel in fp32.
3. Patches in 2x2 merge-block order (block row, block column, row in block, column in block), each flattened as
   (channel, temporal, row, column) with the one frame repeated ``temporal_patch_size`` times.

transformers' torchvision ("fast") processor is not installed with ninfer; this file matches its Pillow
("slow") backend, which is the oracle in tests/frontend/test_image_processor.py.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ninfer.models.qwen3_5.vision_config import DEFAULT_PREPROCESSOR, VisionConfig

MAX_ASPECT = 200


class ImageRejected(ValueError):
    """An image the processor cannot take (the message names why); the Gateway answers it with a 400."""


@dataclass(frozen=True)
class ImageProcessorConfig:
    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    rescale_factor: float
    do_rescale: bool
    do_normalize: bool
    resample: int  # Pillow filter number (3 = bicubic)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_json(cls, data: bytes | str | None, vision: VisionConfig) -> "ImageProcessorConfig":
        """From ``preprocessor_config.json`` (None: the released constants); its patch geometry must be the
        tower's."""
        raw: Mapping[str, Any] = DEFAULT_PREPROCESSOR if data is None else json.loads(data)
        size = dict(raw.get("size") or {})
        cfg = cls(
            min_pixels=int(raw.get("min_pixels", size.get("shortest_edge", 56 * 56))),
            max_pixels=int(raw.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280))),
            patch_size=int(raw.get("patch_size", 14)), temporal_patch_size=int(raw.get("temporal_patch_size", 2)),
            merge_size=int(raw.get("merge_size", 2)),
            image_mean=tuple(float(x) for x in raw.get("image_mean", (0.48145466, 0.4578275, 0.40821073))),
            image_std=tuple(float(x) for x in raw.get("image_std", (0.26862954, 0.26130258, 0.27577711))),
            rescale_factor=float(raw.get("rescale_factor", 1 / 255)), do_rescale=bool(raw.get("do_rescale", True)),
            do_normalize=bool(raw.get("do_normalize", True)), resample=int(raw.get("resample", 3)))
        got = (cfg.patch_size, cfg.temporal_patch_size, cfg.merge_size)
        want = (vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size)
        if got != want:
            raise ValueError(f"preprocessor_config.json: patch/temporal/merge {got} differ from the tower's {want}")
        if not 0 < cfg.min_pixels <= cfg.max_pixels:
            raise ValueError(f"preprocessor_config.json: pixel bounds [{cfg.min_pixels}, {cfg.max_pixels}] are empty")
        return cfg


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The (height, width) an image is resized to: multiples of ``factor``, area within [min, max] pixels."""
    if min(height, width) < 1:
        raise ImageRejected(f"image of {width}x{height} pixels is empty")
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ImageRejected(f"image of {width}x{height} pixels: aspect ratio over {MAX_ASPECT}")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


@dataclass(frozen=True)
class ProcessedImage:
    pixels: np.ndarray  # float32 [h * w, C * temporal * patch * patch], merge-block order
    grid: tuple[int, int, int]  # (t, h, w) in patches
    digest: str  # of the resized RGB pixels: the image's content identity

    @property
    def num_tokens(self) -> int:
        """``<|image_pad|>`` tokens this image expands to (merged patches)."""
        t, h, w = self.grid
        return t * h * w // 4


def resized_size(cfg: ImageProcessorConfig, width: int, height: int) -> tuple[int, int]:
    return smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)


def to_rgb(image: Any) -> Any:
    """RGB, transparency composited onto white (transformers' ``convert_to_rgb``)."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def process_image(cfg: ImageProcessorConfig, image: Any) -> ProcessedImage:
    """A Pillow image (any mode) -> its patches, grid and digest."""
    rgb = to_rgb(image)
    h, w = resized_size(cfg, rgb.width, rgb.height)
    resized = np.asarray(rgb.resize((w, h), resample=cfg.resample))  # uint8 [h, w, 3]
    digest = hashlib.blake2b(resized.tobytes() + f"{h}x{w}".encode(), digest_size=16).hexdigest()
    # the rescale in fp64 rounded once to fp32, the normalisation in fp32: transformers' order and precision
    x = (resized * cfg.rescale_factor if cfg.do_rescale else resized).astype(np.float32)
    if cfg.do_normalize:
        x = (x - np.asarray(cfg.image_mean, np.float32)) / np.asarray(cfg.image_std, np.float32)
    return ProcessedImage(_patchify(cfg, x.transpose(2, 0, 1)), (1, h // cfg.patch_size, w // cfg.patch_size), digest)


def _patchify(cfg: ImageProcessorConfig, chw: np.ndarray) -> np.ndarray:
    C, H, W = chw.shape
    P, m, T = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = H // P, W // P
    x = chw.reshape(C, gh // m, m, P, gw // m, m, P)
    x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # [block row, block col, row in block, col in block, C, P, P]
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], T, P, P))  # the frame repeated in time
    return np.ascontiguousarray(x.reshape(gh * gw, C * T * P * P), dtype=np.float32)
