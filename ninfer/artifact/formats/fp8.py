"""FP8 e4m3 values with fp32 scales, per row or per 2-D block: ``value = fp8(data) * scale``.

Planes: ``data`` float8_e4m3fn bits, same shape as the tensor; ``scales`` fp32, either one per row
(shape ``shape[:-1]``, params ``{}``) or one per ``[br, bc]`` block of the last two dims (params
``{"block": [br, bc]}``, shape ``[..., ceil(R/br), ceil(C/bc)]``). Scales map the row/block absolute maximum onto
the largest finite e4m3 value, 448.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from .base import Format, need_matrix
from .planes import PlaneSpec

E4M3_MAX = 448.0


def fp8_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> e4m3 bit patterns (uint8), saturating instead of producing NaN."""
    t = torch.from_numpy(np.clip(np.ascontiguousarray(x, dtype=np.float32), -E4M3_MAX, E4M3_MAX))
    return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def fp8_values(bits: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(bits, dtype=np.uint8)).view(torch.float8_e4m3fn).float().numpy()


def _block(params: Mapping[str, Any]) -> tuple[int, int] | None:
    b = params.get("block")
    if b is None:
        return None
    if len(b) != 2 or min(int(b[0]), int(b[1])) <= 0:
        raise ValueError(f"fp8 block must be two positive ints, got {b!r}")
    return int(b[0]), int(b[1])


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _expand(scales: np.ndarray, shape: tuple[int, ...], block: tuple[int, int] | None) -> np.ndarray:
    """Broadcast the scales plane to the tensor's shape."""
    if block is None:
        return scales[..., None]
    br, bc = block
    full = np.repeat(np.repeat(scales, br, axis=-2), bc, axis=-1)
    return full[..., : shape[-2], : shape[-1]]


class FP8E4M3(Format):
    name = "fp8_e4m3"
    dtypes = ("float8_e4m3fn",)

    def check(self, shape, dtype, params) -> None:
        super().check(shape, dtype, params)
        need_matrix(self.name, shape, 1)
        _block(params)

    def planes(self, shape, dtype, params) -> list[PlaneSpec]:
        self.check(shape, dtype, params)
        block = _block(params)
        if block is None:
            scales = PlaneSpec("scales", "float32", tuple(shape[:-1]), 1)
        else:
            sshape = (*shape[:-2], _cdiv(shape[-2], block[0]), _cdiv(shape[-1], block[1]))
            # A 2-D tensor's scale rows each cover `br` logical rows; higher ranks keep axis 0 as is.
            scales = PlaneSpec("scales", "float32", sshape, block[0] if len(shape) == 2 else 1)
        return [PlaneSpec("data", "float8_e4m3fn", tuple(shape), 1), scales]

    def pack(self, values: np.ndarray, dtype: str, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        x = np.asarray(values, dtype=np.float32)
        block = _block(params)
        if block is None:
            amax = np.abs(x).max(axis=-1)
        else:
            br, bc = block
            r, c = x.shape[-2], x.shape[-1]
            pad = [(0, 0)] * (x.ndim - 2) + [(0, _cdiv(r, br) * br - r), (0, _cdiv(c, bc) * bc - c)]
            xp = np.pad(np.abs(x), pad)
            xp = xp.reshape(*x.shape[:-2], xp.shape[-2] // br, br, xp.shape[-1] // bc, bc)
            amax = xp.max(axis=(-3, -1))
        scales = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
        data = fp8_bits(x / _expand(scales, x.shape, block))
        return {"data": data, "scales": scales}

    def unpack(self, planes, shape, dtype, params) -> np.ndarray:
        scales = np.asarray(planes["scales"], dtype=np.float32).reshape(self.planes(shape, dtype, params)[1].shape)
        data = fp8_values(np.asarray(planes["data"]).reshape(shape))
        return data * _expand(scales, tuple(shape), _block(params))
