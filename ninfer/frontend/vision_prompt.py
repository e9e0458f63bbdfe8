"""Images into a prompt: decode and preprocess each image, expand its ``<|image_pad|>`` into one placeholder id per
merged patch (its content identity, ``ninfer.contracts.media``), and construct the 3-row MRoPE positions.

MRoPE (transformers' ``Qwen3_5Model.get_rope_index``): text tokens take consecutive positions, the same in all three
rows; an image whose merged grid is (t, h, w) starting at position s gives its token at (frame f, row r, column c)
the positions (s + f, s + r, s + c) and moves the next text position to s + max(h, w). The ``<|vision_start|>`` and
``<|vision_end|>`` around it are text. After the prompt every row is index + rope_delta, rope_delta = max
position + 1 - prompt length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ninfer.contracts import RejectReason, RequestRejected
from ninfer.contracts.media import PromptImage, PromptMedia, placeholder_ids
from ninfer.models.qwen3_5.vision_config import VisionConfig

from .image_processor import ImageProcessorConfig, ImageRejected, ProcessedImage, process_image
from .media import ImageData, decode_image


@dataclass(frozen=True)
class VisionLimits:
    max_images: int  # per prompt (--limit-mm-per-prompt)
    max_image_pixels: int = 64 << 20  # decoded size of one image, checked before decoding


def mrope_positions(num_tokens: int, images: Sequence[PromptImage]) -> tuple[np.ndarray, int]:
    """int64 [3, num_tokens] positions and rope_delta of a prompt with ``images`` (sorted, disjoint)."""
    out = np.empty((3, num_tokens), dtype=np.int64)
    pos, at = 0, 0
    for img in images:
        n = img.offset - at
        out[:, at:img.offset] = np.arange(pos, pos + n)
        pos += n
        t, h, w = img.grid[0], img.grid[1] // img.merge, img.grid[2] // img.merge
        f, r, c = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        out[:, img.offset:img.end] = pos + np.stack([f.ravel(), r.ravel(), c.ravel()])
        pos += max(h, w)
        at = img.end
    out[:, at:] = np.arange(pos, pos + num_tokens - at)
    top = int(out.max()) if num_tokens else -1
    return out, top + 1 - num_tokens


class VisionPrompt:
    """The Frontend's vision path for one tower and processor configuration."""

    def __init__(self, vision: VisionConfig, processor: ImageProcessorConfig, limits: VisionLimits):
        self.vision, self.processor, self.limits = vision, processor, limits

    def process(self, images: Sequence[ImageData]) -> list[ProcessedImage]:
        if len(images) > self.limits.max_images:
            raise RequestRejected(RejectReason.UNREPRESENTABLE, f"{len(images)} images in one prompt, over the limit "
                                  f"of {self.limits.max_images} (--limit-mm-per-prompt)")
        out = []
        for i, data in enumerate(images):
            try:
                out.append(process_image(self.processor, decode_image(data, self.limits.max_image_pixels)))
            except ImageRejected as e:
                raise RequestRejected(RejectReason.UNREPRESENTABLE, f"image {i}: {e}") from None
        return out

    def expand(self, ids: Sequence[int], bounds: Sequence[int], images: Sequence[ProcessedImage]
               ) -> tuple[list[int], list[int], PromptMedia]:
        """Each image's one pad -> its placeholder ids; boundary token counts shifted past the expansions."""
        v = self.vision
        pads = [i for i, t in enumerate(ids) if t == v.image_token_id]
        framed = all(0 < i < len(ids) - 1 and ids[i - 1] == v.vision_start_token_id
                     and ids[i + 1] == v.vision_end_token_id for i in pads)
        if len(pads) != len(images) or not framed:
            raise RequestRejected(RejectReason.UNREPRESENTABLE, f"the prompt has {len(pads)} image pad tokens for "
                                  f"{len(images)} images (text must not spell <|image_pad|> or the vision markers)")
        out: list[int] = []
        placed: list[PromptImage] = []
        at = 0
        for pad, img in zip(pads, images):
            out.extend(ids[at:pad])
            placed.append(PromptImage(len(out), img.grid, v.spatial_merge_size, img.digest, img.pixels))
            out.extend(placeholder_ids(img.digest, img.num_tokens))
            at = pad + 1
        out.extend(ids[at:])
        shifted = [n + sum(p.tokens - 1 for p, pad in zip(placed, pads) if pad < n) for n in bounds]
        positions, delta = mrope_positions(len(out), placed)
        return out, shifted, PromptMedia(tuple(placed), v.image_token_id, positions, delta)
