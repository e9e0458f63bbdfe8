"""One pre-norm decoder layer: ``h = x + Mixer(norm_in(x)); out = h + FFN(norm_post(h))``."""

from __future__ import annotations

from typing import Callable

import torch

from ninfer.models.qwen3_5.config import Qwen35Config

from .ffn import ffn
from .norms import zc_rms_norm
from .scope import Scope

Mixer = Callable[[torch.Tensor], torch.Tensor]


def decoder_layer(x: torch.Tensor, w: Scope, cfg: Qwen35Config, mixer: Mixer) -> torch.Tensor:
    """x [T, H] -> [T, H]; ``w`` is scoped at the layer, ``mixer`` is its GDN or attention bound to its state."""
    h = x + mixer(zc_rms_norm(x, w["input_layernorm.weight"], cfg.rms_norm_eps))
    return h + ffn(zc_rms_norm(h, w["post_attention_layernorm.weight"], cfg.rms_norm_eps), w.sub("mlp"), cfg)
