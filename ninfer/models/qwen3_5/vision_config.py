"""Frozen geometry of the Qwen3.5 vision tower and its logical parameters (``visual.*``), read from the HF
``vision_config`` of a ``qwen3_5`` / ``qwen3_5_moe`` config (transformers' ``Qwen3_5VisionConfig`` defaults).

The tower (transformers' ``Qwen3_5VisionModel``): a Conv3d patch embed over (temporal 2, 16, 16) patches, a learned
``side x side`` position table resampled bilinearly to each image's patch grid, ``depth`` pre-norm ViT blocks with
axial 2D rotary, and a 2x2 patch merger into the text hidden size. No deepstack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

# Activations of the vision MLP that ninfer.reference.activations computes (transformers' ACT2FN names).
VISION_ACTS = ("gelu_pytorch_tanh", "gelu", "gelu_new", "silu", "relu")
# transformers' Qwen3_5Config token ids.
_TOKEN_DEFAULTS = dict(image_token_id=248056, video_token_id=248057, vision_start_token_id=248053,
                       vision_end_token_id=248054)
_GEOMETRY_DEFAULTS = dict(depth=27, hidden_size=1152, hidden_act="gelu_pytorch_tanh", intermediate_size=4304,
                          num_heads=16, in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                          out_hidden_size=3584, num_position_embeddings=2304)

# The image processor constants of the released Qwen3.5 checkpoints (those of Qwen3-VL: transformers'
# Qwen2VLImageProcessor with patch 16, merge 2, temporal 2, mean = std = 0.5, pixels in [256*256, 4096*4096]),
# used when a checkpoint ships no preprocessor_config.json.
DEFAULT_PREPROCESSOR = {
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
    "image_processor_type": "Qwen2VLImageProcessor",
}


def _error(field: str, message: str) -> Exception:
    from .config import ConfigError

    return ConfigError(f"vision_config.{field}", message)


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    hidden_act: str
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    out_hidden_size: int
    num_position_embeddings: int
    rope_theta: float
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int

    def __post_init__(self) -> None:
        for name in ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
                     "spatial_merge_size", "temporal_patch_size", "out_hidden_size", "num_position_embeddings"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise _error(name, f"must be a positive integer, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_heads:
            raise _error("num_heads", f"{self.num_heads} does not divide hidden_size={self.hidden_size}")
        if self.head_dim % 4:
            # axial rotary: head_dim/4 frequencies for rows and as many for columns, each used twice (rotate_half)
            raise _error("hidden_size", f"head_dim {self.head_dim} must be a multiple of 4 for the 2D rotary")
        if math.isqrt(self.num_position_embeddings) ** 2 != self.num_position_embeddings:
            raise _error("num_position_embeddings", f"{self.num_position_embeddings} is not a square grid")
        if self.hidden_act not in VISION_ACTS:
            raise _error("hidden_act", f"{self.hidden_act!r} is not supported; ninfer runs {VISION_ACTS}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def grid_side(self) -> int:
        """Side of the learned square position-embedding table (48 in the released towers)."""
        return math.isqrt(self.num_position_embeddings)

    @property
    def merge_unit(self) -> int:
        """Patches merged into one text token (2 x 2)."""
        return self.spatial_merge_size ** 2

    @property
    def patch_dim(self) -> int:
        """Values of one flattened patch: channels x temporal x patch x patch, in that order."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    def media_mismatch(self, media: Any, max_patches: int = 0) -> str | None:
        """Why a prompt's images (a `PromptMedia` that passed its own `check`) do not fit this tower, None when they
        do: the pad id the model embeds at their places, the merge and each patch's values must be this tower's,
        and (with `max_patches` > 0, what a Program planned its encode for) no image may have more patches.
        A library caller can build media consistent in themselves for another model or processor; served, they
        would fail a model call or outgrow the plan (Engine-wide), so the Programs refuse them at the plan
        (permanent: a 400)."""
        if media.image_token_id != self.image_token_id:
            return f"the images' pad id {media.image_token_id} is not this model's {self.image_token_id}"
        for i, img in enumerate(media.images):
            if img.merge != self.spatial_merge_size:
                return (f"image {i} merges {img.merge}x{img.merge} patches a token, this tower "
                        f"{self.spatial_merge_size}x{self.spatial_merge_size}")
            if img.pixels.shape[1] != self.patch_dim:
                return f"image {i}'s patches hold {img.pixels.shape[1]} values, this tower's {self.patch_dim}"
            if max_patches and img.pixels.shape[0] > max_patches:
                return (f"image {i} has {img.pixels.shape[0]} patches, this server encodes at most {max_patches} "
                        "(the processor's max_pixels)")
        return None

    @property
    def factor(self) -> int:
        """Image sides are resized to multiples of this (patch x merge = 32)."""
        return self.patch_size * self.spatial_merge_size

    def geometry_line(self) -> str:
        return (f"depth {self.depth}, hidden {self.hidden_size}, {self.num_heads} heads x {self.head_dim}, "
                f"mlp {self.intermediate_size} ({self.hidden_act}), patch {self.patch_size} temporal "
                f"{self.temporal_patch_size}, merge {self.spatial_merge_size}x{self.spatial_merge_size} -> "
                f"{self.out_hidden_size}, pos grid {self.grid_side}x{self.grid_side}")

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any]) -> "VisionConfig":
        """From a top-level HF multimodal config (``vision_config`` plus the token ids beside it)."""
        v = raw.get("vision_config")
        if not isinstance(v, Mapping):
            raise _error("", "must be an object")
        kw: dict[str, Any] = {k: v.get(k, d) for k, d in _GEOMETRY_DEFAULTS.items()}
        for k in ("patch_size", "temporal_patch_size"):
            if isinstance(kw[k], (list, tuple)):
                if len(set(kw[k])) != 1:
                    raise _error(k, f"non-square {kw[k]} is not supported")
                kw[k] = kw[k][0]
        rope = v.get("rope_parameters") or {}
        if rope.get("rope_type", "axial") != "axial":
            raise _error("rope_parameters.rope_type", f"{rope.get('rope_type')!r}: the tower's rotary is axial")
        kw["rope_theta"] = float(rope.get("rope_theta", v.get("rope_theta", 10000.0)))
        for k, d in _TOKEN_DEFAULTS.items():
            kw[k] = int(raw.get(k, d))
        return cls(**kw)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "VisionConfig":
        return cls(**dict(d))

