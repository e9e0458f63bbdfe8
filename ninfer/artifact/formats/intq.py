"""Group-quantized integers (int4, int5, int8) with one scale per group of the last dim, optionally a zero point
per group and an act-order column permutation.

``value = (u - z) * s`` in fp32, where ``u`` is the stored unsigned code, ``s`` the group's scale and ``z`` the
group's zero code (``2^(b-1)`` when the object has no ``zeros`` plane: symmetric, offset-binary).

Planes, one row per logical row so any row range is a byte range:

- ``data`` uint8 ``[..., C*b/8]``: each row a little-endian bit stream, code k at bits ``[k*b, k*b+b)`` (int4:
  element 2j in the low nibble of byte j; int5: 8 codes fill 5 bytes; int8: one byte per code);
- ``scales`` ``scale_dtype`` (float16, default, or bfloat16) ``[..., C/g]``;
- ``zeros`` uint8 ``[..., C/g]`` (params ``zero_point: true``): the zero code of each group, 0..2^b;
- ``perm`` int32 ``[*shape[:-2], C]`` (params ``act_order: true``): stored column j holds logical column
  ``perm[j]``, so groups are contiguous in storage and ``W @ x == W_stored @ x[perm]``. One permutation per matrix:
  shared by every row (``rows_per_entry`` 0) of a 2-D object, one per entry of a 3-D (experts) object.

``group_size`` must be a multiple of 8 and divide the last dim, so rows and groups are whole bytes.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .base import Format, need_matrix, pack_bits, unpack_bits
from .dense import from_bits, to_bits
from .planes import PlaneSpec

BITS = {"int4": 4, "int5": 5, "int8": 8}
SCALE_DTYPES = ("float16", "bfloat16")


def _group(params: Mapping[str, Any]) -> int:
    g = int(params.get("group_size", 0))
    if g <= 0 or g % 8:
        raise ValueError(f"group_size must be a positive multiple of 8, got {params.get('group_size')!r}")
    return g


def _scale_dtype(params: Mapping[str, Any]) -> str:
    d = params.get("scale_dtype", "float16")
    if d not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be one of {SCALE_DTYPES}, got {d!r}")
    return d


def _scales(values: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 scales -> the plane (fp16, or bf16 bits), and back to the fp32 the reader multiplies by."""
    return to_bits(values, dtype)


def scale_values(plane: np.ndarray, dtype: str) -> np.ndarray:
    return from_bits(plane, dtype) if dtype == "bfloat16" else np.asarray(plane).view(np.float16).astype(np.float32)


class IntGroup(Format):
    name = "int_group"
    dtypes = tuple(BITS)

    def check(self, shape, dtype, params) -> None:
        super().check(shape, dtype, params)
        need_matrix(self.name, shape, _group(params))
        _scale_dtype(params)

    def planes(self, shape, dtype, params) -> list[PlaneSpec]:
        self.check(shape, dtype, params)
        b, g, c = BITS[dtype], _group(params), shape[-1]
        lead = tuple(shape[:-1])
        out = [PlaneSpec("data", "uint8", (*lead, c * b // 8), 1),
               PlaneSpec("scales", _scale_dtype(params), (*lead, c // g), 1)]
        if params.get("zero_point"):
            out.append(PlaneSpec("zeros", "uint8", (*lead, c // g), 1))
        if params.get("act_order"):
            out.append(PlaneSpec("perm", "int32", (*shape[:-2], c), 0 if len(shape) == 2 else 1))
        return out

    def pack(self, values: np.ndarray, dtype: str, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Round-to-nearest per group: symmetric (amax / (2^(b-1)-1)) or, with ``zero_point``, min/max affine."""
        if params.get("act_order"):
            raise ValueError("int_group pack has no column order to choose; act-order objects come from imports")
        x = np.asarray(values, dtype=np.float32)
        b, g, sd = BITS[dtype], _group(params), _scale_dtype(params)
        xg = x.reshape(*x.shape[:-1], x.shape[-1] // g, g)
        if params.get("zero_point"):
            lo, hi = np.minimum(xg.min(axis=-1), 0.0), np.maximum(xg.max(axis=-1), 0.0)
            scales = _scales(np.where(hi > lo, (hi - lo) / ((1 << b) - 1), 1.0), sd)
            s = scale_values(scales, sd)
            zeros = np.clip(np.rint(-lo / s), 0, (1 << b) - 1).astype(np.uint8)
            z = zeros.astype(np.float32)
        else:
            qmax = (1 << (b - 1)) - 1
            amax = np.abs(xg).max(axis=-1)
            scales = _scales(np.where(amax > 0, amax / qmax, 1.0), sd)
            s = scale_values(scales, sd)
            zeros, z = None, np.full(s.shape, float(1 << (b - 1)), dtype=np.float32)
        # Quantize against the rounded scale the reader will multiply by.
        u = np.clip(np.rint(xg / s[..., None]) + z[..., None], 0, (1 << b) - 1).astype(np.uint8).reshape(x.shape)
        out = {"data": pack_bits(u, b), "scales": scales}
        if zeros is not None:
            out["zeros"] = zeros
        return out

    def unpack(self, planes, shape, dtype, params) -> np.ndarray:
        b, g, sd = BITS[dtype], _group(params), _scale_dtype(params)
        specs = {p.name: p for p in self.planes(shape, dtype, params)}
        u = unpack_bits(np.asarray(planes["data"], dtype=np.uint8).reshape(specs["data"].shape), b, shape[-1])
        s = scale_values(np.asarray(planes["scales"]).reshape(specs["scales"].shape), sd)
        if "zeros" in specs:
            z = np.asarray(planes["zeros"], dtype=np.uint8).reshape(specs["zeros"].shape).astype(np.float32)
        else:
            z = np.float32(1 << (b - 1))
        ug = u.astype(np.float32).reshape(*shape[:-1], shape[-1] // g, g)
        stored = ((ug - np.asarray(z)[..., None]) * s[..., None]).reshape(shape)
        if "perm" not in specs:
            return stored
        return unpermute(stored, np.asarray(planes["perm"]).reshape(specs["perm"].shape))


def unpermute(stored: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Stored column j holds logical column perm[j] (one permutation per matrix): scatter the columns back."""
    out = np.empty_like(stored)
    if stored.ndim == 2:
        out[:, perm] = stored
        return out
    for e in range(stored.shape[0]):
        out[e][:, perm[e]] = stored[e]
    return out
