"""Module-scoped fp64 reference models shared by the reference tests."""

from __future__ import annotations

import pytest
import torch

from ninfer.reference.model import ReferenceModel
from refmodels import random_weights, tiny_config


@pytest.fixture(scope="module")
def dense64() -> ReferenceModel:
    cfg = tiny_config()
    return ReferenceModel(cfg, random_weights(cfg), dtype=torch.float64)


@pytest.fixture(scope="module")
def moe64() -> ReferenceModel:
    cfg = tiny_config(moe=True, hv_per_hk=1)
    return ReferenceModel(cfg, random_weights(cfg, seed=1), dtype=torch.float64)


@pytest.fixture(params=["dense", "moe"])
def model64(request, dense64, moe64) -> ReferenceModel:
    return dense64 if request.param == "dense" else moe64
