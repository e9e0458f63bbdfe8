"""Dense storage: one ``data`` plane holding the values row-major in bf16, fp16 or fp32."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from .base import Format
from .planes import PlaneSpec


def to_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 values -> the plane's numpy array (bf16 as uint16 bits, rounded to nearest even by torch)."""
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(torch.bfloat16).view(torch.uint16).numpy()
    return np.ascontiguousarray(values, dtype=np.float16 if dtype == "float16" else np.float32)


def from_bits(data: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(data).view(np.uint16)).view(torch.bfloat16).float().numpy()
    return np.asarray(data).astype(np.float32)


class Dense(Format):
    name = "dense"
    dtypes = ("bfloat16", "float16", "float32")

    def planes(self, shape, dtype, params) -> list[PlaneSpec]:
        self.check(shape, dtype, params)
        return [PlaneSpec("data", dtype, tuple(shape), 1 if shape else 0)]

    def pack(self, values: np.ndarray, dtype: str, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"data": to_bits(values, dtype)}

    def unpack(self, planes, shape, dtype, params) -> np.ndarray:
        return from_bits(planes["data"], dtype).reshape(shape)


class Raw(Format):
    """Opaque bytes (Frontend resources): one uint8 ``data`` plane."""

    name = "raw"
    dtypes = ("uint8",)

    def check(self, shape, dtype, params) -> None:
        super().check(shape, dtype, params)
        if len(shape) != 1:
            raise ValueError(f"format 'raw' stores a 1-D byte string, got shape {list(shape)}")

    def planes(self, shape, dtype, params) -> list[PlaneSpec]:
        self.check(shape, dtype, params)
        return [PlaneSpec("data", "uint8", tuple(shape), 0)]

    def pack(self, values: np.ndarray, dtype: str, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"data": np.ascontiguousarray(values, dtype=np.uint8)}

    def unpack(self, planes, shape, dtype, params) -> np.ndarray:
        return np.asarray(planes["data"], dtype=np.uint8).reshape(shape)
