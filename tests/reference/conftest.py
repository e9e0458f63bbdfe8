"""Tiny random Qwen3.5 models for the reference tests, built without transformers (fast, fp64-able).

The helpers are handed out as fixtures (``tiny_config``, ``random_weights``, ``make_tokens``) because the suite
imports test modules in importlib mode, where test files cannot import sibling modules.
"""

from __future__ import annotations

import math

import pytest
import torch

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.params import logical_parameters
from ninfer.reference.model import ReferenceModel
from ninfer.testing.checkpoints import tiny_text_config


def _tiny_config(*, moe: bool = False, tie: bool = False, hv_per_hk: int = 2, num_layers: int = 4) -> Qwen35Config:
    raw = tiny_text_config(moe=moe, tie=tie, hv_per_hk=hv_per_hk, num_layers=num_layers)
    raw.update(model_type="qwen3_5_moe_text" if moe else "qwen3_5_text", mtp_num_hidden_layers=1)
    return Qwen35Config.from_hf(raw)


def _random_weights(cfg: Qwen35Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random logical weights with realistic magnitudes: norms near their neutral value, decays spread out."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, spec in logical_parameters(cfg).items():
        if name.endswith("A_log"):
            t = torch.empty(spec.shape).uniform_(1.0, 16.0, generator=g).log()
        elif name.endswith("dt_bias"):
            t = torch.rand(spec.shape, generator=g)
        elif name.endswith("linear_attn.norm.weight"):
            t = 1.0 + 0.1 * torch.randn(spec.shape, generator=g)  # the gated norm's weight is plain, not 1+w
        elif spec.kind == "norm":
            t = 0.1 * torch.randn(spec.shape, generator=g)
        else:
            fan_in = spec.shape[-1]
            t = torch.randn(spec.shape, generator=g) / math.sqrt(fan_in)
        out[name] = t
    if cfg.tie_word_embeddings:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


def _tokens(n: int, vocab: int = 512, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="session")
def tiny_config():
    return _tiny_config


@pytest.fixture(scope="session")
def random_weights():
    return _random_weights


@pytest.fixture(scope="session")
def make_tokens():
    return _tokens


@pytest.fixture(scope="module")
def dense64() -> ReferenceModel:
    cfg = _tiny_config()
    return ReferenceModel(cfg, _random_weights(cfg), dtype=torch.float64)


@pytest.fixture(scope="module")
def moe64() -> ReferenceModel:
    cfg = _tiny_config(moe=True, hv_per_hk=1)
    return ReferenceModel(cfg, _random_weights(cfg, seed=1), dtype=torch.float64)


@pytest.fixture(params=["dense", "moe"])
def model64(request, dense64, moe64) -> ReferenceModel:
    return dense64 if request.param == "dense" else moe64
