"""Group-quantized signed integers (int4, int5) with one fp16 scale per group of the last dim.

Symmetric, no zero point: ``q = clip(round(x / s), -2^(b-1), 2^(b-1)-1)`` with ``s = amax(group) / (2^(b-1)-1)``,
stored offset-binary as ``u = q + 2^(b-1)``; ``value = (u - 2^(b-1)) * s``.

Planes: ``data`` uint8 ``[..., C*b/8]`` and ``scales`` float16 ``[..., C/group_size]``, one row per logical row so
any row range is a byte range. Bit order: each row is a little-endian bit stream in which code k occupies bits
``[k*b, k*b+b)``; for int4 that is element 2j in the low nibble of byte j, for int5 every 8 codes fill 5 bytes.
``group_size`` must be a multiple of 8 and divide the last dim.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .base import Format, need_matrix, pack_bits, unpack_bits
from .planes import PlaneSpec

BITS = {"int4": 4, "int5": 5}


def _group(params: Mapping[str, Any]) -> int:
    g = int(params.get("group_size", 0))
    if g <= 0 or g % 8:
        raise ValueError(f"group_size must be a positive multiple of 8, got {params.get('group_size')!r}")
    return g


class IntGroup(Format):
    name = "int_group"
    dtypes = ("int4", "int5")

    def check(self, shape, dtype, params) -> None:
        super().check(shape, dtype, params)
        need_matrix(self.name, shape, _group(params))

    def planes(self, shape, dtype, params) -> list[PlaneSpec]:
        self.check(shape, dtype, params)
        b, g, c = BITS[dtype], _group(params), shape[-1]
        return [PlaneSpec("data", "uint8", (*shape[:-1], c * b // 8), 1),
                PlaneSpec("scales", "float16", (*shape[:-1], c // g), 1)]

    def pack(self, values: np.ndarray, dtype: str, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        x = np.asarray(values, dtype=np.float32)
        b, g = BITS[dtype], _group(params)
        qmax = (1 << (b - 1)) - 1
        xg = x.reshape(*x.shape[:-1], x.shape[-1] // g, g)
        amax = np.abs(xg).max(axis=-1)
        scales = np.where(amax > 0, amax / qmax, 1.0).astype(np.float16)
        # Quantize against the fp16-rounded scale the reader will multiply by.
        q = np.clip(np.rint(xg / scales.astype(np.float32)[..., None]), -qmax - 1, qmax).astype(np.int16)
        u = (q + (1 << (b - 1))).astype(np.uint8).reshape(x.shape)
        return {"data": pack_bits(u, b), "scales": scales}

    def unpack(self, planes, shape, dtype, params) -> np.ndarray:
        b, g = BITS[dtype], _group(params)
        data_spec, scale_spec = self.planes(shape, dtype, params)
        u = unpack_bits(np.asarray(planes["data"], dtype=np.uint8).reshape(data_spec.shape), b, shape[-1])
        q = u.astype(np.float32) - (1 << (b - 1))
        s = np.asarray(planes["scales"]).view(np.float16).reshape(scale_spec.shape).astype(np.float32)
        return (q.reshape(*shape[:-1], shape[-1] // g, g) * s[..., None]).reshape(shape)
