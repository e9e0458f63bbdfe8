"""A random-weight multimodal test model with the real vocabulary: the embedded default model's text decoder (real
tokenizer and chat template, so the real image token ids) plus a tiny vision tower at the real patch geometry
(``checkpoints.tiny_vision_config``) and the tiny processor bounds (``checkpoints.TINY_PREPROCESSOR``). What the
Gateway and Engine image tests serve; its outputs are noise."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ninfer.convert import default_model as dm
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.params import vision_parameters

from .checkpoints import TINY_PREPROCESSOR, tiny_vision_config


def vision_test_config() -> Qwen35Config:
    text = dict(dm.HF_CONFIG, model_type="qwen3_5_text")
    text.pop("architectures")
    vision = dict(tiny_vision_config(out_hidden_size=text["hidden_size"]), model_type="qwen3_5_vision")
    return Qwen35Config.from_hf({"model_type": "qwen3_5", "text_config": text, "vision_config": vision,
                                 "tie_word_embeddings": True})


def _vision_tensors(cfg: Qwen35Config, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for spec in vision_parameters(cfg.vision):
        noise = torch.randn(spec.shape, generator=gen) * dm.INIT_STD
        layer_norm_scale = spec.name.endswith(("norm1.weight", "norm2.weight", "norm.weight"))
        yield spec.name, (1.0 + noise if layer_norm_scale else noise).to(torch.bfloat16)


def build_vision_test_model(path: str | Path, seed: int = dm.SEED, preprocessor: dict | None = None) -> Path:
    """The artifact at ``path``; ``preprocessor`` replaces the tiny processor constants."""
    from ninfer.artifact import write_artifact

    cfg = vision_test_config()
    resources = dm._resources()
    resources["preprocessor_config.json"] = json.dumps(preprocessor or TINY_PREPROCESSOR, indent=2).encode("utf-8")
    tensors = (*dm.random_tensors(cfg, seed), *_vision_tensors(cfg, seed + 1))
    return write_artifact(Path(path), cfg, iter(tensors), resources=resources,
                          metadata={"name": "ninfer-vision-test-random", "random_weights": True})
