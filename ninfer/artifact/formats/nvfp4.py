"""NVFP4: e2m1 values in 16-element blocks, an fp8-e4m3 scale per block and one fp32 scale per tensor.

``value = e2m1(code) * e4m3(block_scale) * global_scale``. The global scale maps the tensor's absolute maximum onto
``448 * 6`` (largest e4m3 times largest e2m1) so the block scales use the whole e4m3 range.

Planes: ``data`` uint8 ``[..., C/2]`` (element 2j in the low nibble of byte j; a code is sign bit 3 plus a 3-bit
index into the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6), ``scales`` e4m3 bits ``[..., C/16]``, ``global_scale`` fp32:
``[1]`` shared by every row (so a row view keeps the whole plane), or with params ``{"global_rows": r}`` one per
``r`` rows of the last-but-one dim (``[R/r]`` for a 2-D tensor, ``[E, R/r]`` for 3-D experts: an imported fused
gate/up keeps each source tensor's own ``weight_scale_2``). With ``{"input_scale": true}`` an ``input_scale`` fp32
plane of the global scale's shape keeps the checkpoint's static activation scales (used only by A4 execution).

The fp32 product is evaluated as ``e2m1 * (e4m3(scale) * global_scale)``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .base import Format, need_matrix, pack_bits, unpack_bits
from .fp8 import E4M3_MAX, fp8_bits, fp8_values
from .planes import PlaneSpec

BLOCK = 16
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


# Midpoints between neighbouring e2m1 magnitudes: a magnitude's code is how many midpoints lie strictly below it.
_MIDPOINTS = (E2M1[1:] + E2M1[:-1]) / 2


def e2m1_codes(x: np.ndarray) -> np.ndarray:
    """Round to the nearest e2m1 value (ties toward the smaller magnitude index) and return 4-bit codes."""
    idx = np.searchsorted(_MIDPOINTS, np.abs(x), side="left").astype(np.uint8)  # no [.., 8] temporary
    return idx | (np.signbit(x).astype(np.uint8) << 3)


def e2m1_values(codes: np.ndarray) -> np.ndarray:
    v = E2M1[codes & 7]
    return np.where(codes & 8, -v, v).astype(np.float32)


class NVFP4(Format):
    name = "nvfp4"
    dtypes = ("nvfp4",)

    def check(self, shape, dtype, params) -> None:
        super().check(shape, dtype, params)
        need_matrix(self.name, shape, BLOCK)
        r = params.get("global_rows")
        if r is not None and (int(r) <= 0 or shape[-2] % int(r)):
            raise ValueError(f"nvfp4 global_rows must be a positive divisor of {shape[-2]}, got {r!r}")

    def planes(self, shape, dtype, params) -> list[PlaneSpec]:
        self.check(shape, dtype, params)
        lead, c = tuple(shape[:-1]), shape[-1]
        out = [PlaneSpec("data", "uint8", (*lead, c // 2), 1),
               PlaneSpec("scales", "float8_e4m3fn", (*lead, c // BLOCK), 1),
               _global_spec("global_scale", shape, params)]
        if params.get("input_scale"):
            out.append(_global_spec("input_scale", shape, params))
        return out

    def pack(self, values: np.ndarray, dtype: str, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if params.get("global_rows") is not None or params.get("input_scale"):
            raise ValueError("nvfp4 pack writes one global scale; per-tensor global and input scales come from imports")
        x = np.asarray(values, dtype=np.float32)
        amax = float(np.abs(x).max()) if x.size else 0.0
        gscale = np.float32(amax / (E4M3_MAX * 6.0) if amax > 0 else 1.0)
        xb = x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
        sbits = fp8_bits(np.abs(xb).max(axis=-1) / (6.0 * gscale))
        block_scale = fp8_values(sbits) * gscale  # [..., C/16]
        safe = np.where(block_scale > 0, block_scale, 1.0)[..., None]
        codes = np.where(block_scale[..., None] > 0, e2m1_codes(xb / safe), 0).astype(np.uint8)
        return {"data": pack_bits(codes.reshape(x.shape), 4), "scales": sbits,
                "global_scale": np.array([gscale], dtype=np.float32)}

    def unpack(self, planes, shape, dtype, params) -> np.ndarray:
        data_spec, scale_spec = self.planes(shape, dtype, params)[:2]
        codes = unpack_bits(np.asarray(planes["data"], dtype=np.uint8).reshape(data_spec.shape), 4, shape[-1])
        s = fp8_values(np.asarray(planes["scales"]).reshape(scale_spec.shape))
        g = expand_global(np.asarray(planes["global_scale"]).view(np.float32), shape, params)
        v = e2m1_values(codes).reshape(*shape[:-1], shape[-1] // BLOCK, BLOCK) * (s * g)[..., None]
        return v.reshape(shape)


def _global_spec(name: str, shape: tuple[int, ...], params: Mapping[str, Any]) -> PlaneSpec:
    r = params.get("global_rows")
    if r is None:
        return PlaneSpec(name, "float32", (1,), 0)
    r = int(r)
    return PlaneSpec(name, "float32", (*shape[:-2], shape[-2] // r), r if len(shape) == 2 else 1)


def expand_global(plane: np.ndarray, shape: tuple[int, ...], params: Mapping[str, Any]) -> np.ndarray:
    """The global scale of each row, shaped ``[*shape[:-1], 1]`` to broadcast over a row's blocks."""
    r = params.get("global_rows")
    if r is None:
        return plane.reshape(-1)[:1].reshape((1,) * (len(shape) - 1) + (1,))
    per = np.repeat(plane.reshape(*shape[:-2], -1), int(r), axis=-1)
    return per[..., : shape[-2], None]
