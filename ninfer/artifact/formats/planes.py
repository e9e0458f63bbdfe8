"""Plane geometry shared by every numeric format: named, typed, row-major byte sub-ranges of one object."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Byte offsets of planes inside an object are rounded up to this, so each plane can be uploaded or viewed alone.
PLANE_ALIGN = 256

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "uint16": 2, "int8": 1, "int32": 4,
            "float8_e4m3fn": 1}

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "uint8": torch.uint8, "int8": torch.int8, "uint16": torch.uint16, "int32": torch.int32,
                "float8_e4m3fn": torch.float8_e4m3fn}

# numpy has no bf16 / fp8: those planes are handled as raw unsigned bits on the numpy side.
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "uint8": np.uint8,
                "uint16": np.uint16, "int8": np.int8, "int32": np.int32, "float8_e4m3fn": np.uint8}


@dataclass(frozen=True)
class PlaneSpec:
    """One plane: ``rows_per_entry`` logical rows map to one leading-dim entry of the plane (0: not row-sliceable).

    A dense or per-row plane has 1; fp8 block scales of 128-row blocks have 128; a per-tensor scale has 0.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    rows_per_entry: int = 1

    @property
    def nbytes(self) -> int:
        n = ITEMSIZE[self.dtype]
        for s in self.shape:
            n *= s
        return n

    def to_dict(self, offset: int) -> dict:
        return {"name": self.name, "offset": offset, "nbytes": self.nbytes, "dtype": self.dtype,
                "shape": list(self.shape), "rows_per_entry": self.rows_per_entry}


def align_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def layout(planes: list[PlaneSpec]) -> tuple[list[int], int]:
    """Offsets of the planes inside their object, and the object's total byte size (last plane unpadded)."""
    offsets, pos = [], 0
    for p in planes:
        pos = align_up(pos, PLANE_ALIGN)
        offsets.append(pos)
        pos += p.nbytes
    return offsets, pos
