"""A read-only view of the logical weight map under one name prefix (``layers.3.self_attn`` etc.)."""

from __future__ import annotations

from typing import Mapping

import torch


class Scope:
    """``Scope(weights, "layers.3")["mlp.up_proj.weight"]`` is ``weights["layers.3.mlp.up_proj.weight"]``."""

    def __init__(self, weights: Mapping[str, torch.Tensor], prefix: str):
        self.weights = weights
        self.prefix = prefix

    def __getitem__(self, name: str) -> torch.Tensor:
        key = f"{self.prefix}.{name}" if self.prefix else name
        try:
            return self.weights[key]
        except KeyError:
            raise KeyError(f"reference model: missing weight {key!r}") from None

    def sub(self, name: str) -> "Scope":
        return Scope(self.weights, f"{self.prefix}.{name}" if self.prefix else name)
