"""Images in a prompt: how they cross from the Frontend through the Engine to the Program.

The prompt's token ids carry each image's content identity. Every ``<|image_pad|>`` position of an image holds a
*placeholder id*, ``PLACEHOLDER_BASE + 62 bits`` of a hash of (the image's digest, the position within the image),
instead of the pad id itself. ``token_digest`` over such a prompt (the prefix identity of the Frontend's
boundaries, the ResourceManager's catalog and every Program's checkpoints) therefore covers the images: the same
image at the same place hits the cache, a different image never does, and no digest anywhere needs to know about
images. The model never sees a placeholder: the Program embeds the pad id (``model_ids``) and then replaces those
rows with the image's features.

``PromptMedia`` also carries what the Frontend constructed for MRoPE: the 3-row (temporal, height, width) position of
every prompt token, and ``rope_delta`` for every token after the prompt (position = index + rope_delta in all rows).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

PLACEHOLDER_BASE = 1 << 62  # above every vocabulary, below int64's limit (token_digest packs ids as int64)


def placeholder_ids(digest: str, n: int) -> tuple[int, ...]:
    """The n placeholder ids of an image whose content digest is ``digest`` (hex)."""
    key = bytes.fromhex(digest)
    out = []
    for k in range(n):
        h = hashlib.blake2b(k.to_bytes(4, "little"), key=key[:64], digest_size=8).digest()
        out.append(PLACEHOLDER_BASE + (int.from_bytes(h, "little") >> 2))
    return tuple(out)


def is_placeholder(token: int) -> bool:
    return token >= PLACEHOLDER_BASE


@dataclass(frozen=True)
class PromptImage:
    """One image of a prompt: where its pads start, its patch grid and its patches."""

    offset: int  # prompt index of its first pad
    grid: tuple[int, int, int]  # (t, h, w) in patches
    merge: int  # spatial merge size (2): pads = t * h * w / merge^2
    digest: str
    pixels: Any = field(compare=False, repr=False)  # float32 [t*h*w, patch_dim], the tower's input order

    @property
    def tokens(self) -> int:
        t, h, w = self.grid
        return t * h * w // (self.merge * self.merge)

    @property
    def end(self) -> int:
        return self.offset + self.tokens


@dataclass(frozen=True)
class PromptMedia:
    images: tuple[PromptImage, ...]
    image_token_id: int
    positions: Any = field(compare=False, repr=False)  # int64 [3, len(prompt)] MRoPE positions
    rope_delta: int = 0  # after the prompt, position = index + rope_delta in all three rows

    def model_ids(self, token_ids: Sequence[int]) -> list[int]:
        """The ids the model embeds: each placeholder becomes the image pad id."""
        pad = self.image_token_id
        return [pad if t >= PLACEHOLDER_BASE else t for t in token_ids]

    def positions_for(self, start: int, end: int) -> np.ndarray:
        """int64 [3, end - start]: the MRoPE positions of sequence indices start..end-1 (prompt or after)."""
        n = self.positions.shape[1]
        head = self.positions[:, min(start, n):min(end, n)]
        tail = np.arange(max(start, n), max(end, n), dtype=np.int64) + self.rope_delta
        return np.concatenate([head, np.broadcast_to(tail, (3, tail.size))], axis=1)

    def drafter_positions(self, start: int, end: int) -> np.ndarray:
        """int64 [end - start]: the 1-D RoPE positions a text-only drafter (DFlash, DFlash2) rotates sequence
        indices start..end-1 at: MRoPE's temporal row, which is the ordinary position on text (shifted by
        rope_delta after an image) and an image's start on its tokens (vLLM's drafters take the same row)."""
        return self.positions_for(start, end)[0]

    def check(self, token_ids: Sequence[int]) -> str | None:
        """Why these media do not fit ``token_ids`` (None when they do): each image's grid is whole merge blocks
        with one row of pixels per patch, every placeholder belongs to exactly one image, each image's run is its
        placeholder ids, and the positions cover the prompt."""
        covered = 0
        for i, img in enumerate(self.images):
            t, h, w = img.grid
            if min(t, h, w) < 1 or h % img.merge or w % img.merge:
                return f"image {i}: grid {img.grid} is not whole {img.merge}x{img.merge} merge blocks"
            if not isinstance(img.pixels, np.ndarray) or img.pixels.dtype.kind != "f":
                return f"image {i}: pixels must be a float numpy array, not {_kind(img.pixels)}"
            if img.pixels.ndim != 2 or img.pixels.shape[0] != t * h * w:
                return f"image {i}: pixels of shape {img.pixels.shape} for a {t}x{h}x{w} patch grid"
            if img.offset < covered or img.end > len(token_ids):
                return f"image {i} (tokens {img.offset}..{img.end}) overlaps another or passes the prompt end"
            if tuple(token_ids[img.offset:img.end]) != placeholder_ids(img.digest, img.tokens):
                return f"image {i}: the prompt's placeholder ids at {img.offset}..{img.end} are not its own"
            covered = img.end
        if sum(1 for t in token_ids if t >= PLACEHOLDER_BASE) != sum(img.tokens for img in self.images):
            return "the prompt has placeholder ids outside its images"
        if not isinstance(self.positions, np.ndarray) or self.positions.dtype.kind not in "iu":
            return f"positions must be an integer numpy array, not {_kind(self.positions)}"
        if tuple(np.shape(self.positions)) != (3, len(token_ids)):
            return f"positions of shape {tuple(np.shape(self.positions))} for a {len(token_ids)}-token prompt"
        return None


def _kind(x: Any) -> str:
    return f"a {x.dtype} array" if isinstance(x, np.ndarray) else type(x).__name__
