"""The numeric-format interface: plane geometry plus a numpy pack/unpack pair for tests and the converter."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .planes import PlaneSpec


class Format:
    """How the values of one object are stored. Subclasses are stateless; params are descriptor data.

    ``planes`` is the single source of geometry: the writer lays objects out with it and the reader checks the
    descriptor against it. ``pack`` takes fp32 values and returns one numpy array per plane (bf16/fp8 planes as raw
    unsigned bits); ``unpack`` is its inverse up to the format's rounding and returns fp32.
    """

    name = ""
    dtypes: tuple[str, ...] = ()

    def check(self, shape: tuple[int, ...], dtype: str, params: Mapping[str, Any]) -> None:
        """Raise ValueError when (shape, dtype, params) is not storable in this format."""
        if dtype not in self.dtypes:
            raise ValueError(f"format {self.name!r} has no dtype {dtype!r}; expected one of {self.dtypes}")

    def planes(self, shape: tuple[int, ...], dtype: str, params: Mapping[str, Any]) -> list[PlaneSpec]:
        raise NotImplementedError

    def pack(self, values: np.ndarray, dtype: str, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def unpack(self, planes: Mapping[str, np.ndarray], shape: tuple[int, ...], dtype: str,
               params: Mapping[str, Any]) -> np.ndarray:
        raise NotImplementedError


def need_matrix(fmt: str, shape: tuple[int, ...], multiple: int) -> None:
    if len(shape) < 2:
        raise ValueError(f"format {fmt!r} needs a tensor of rank >= 2, got shape {list(shape)}")
    if shape[-1] % multiple:
        raise ValueError(f"format {fmt!r} needs the last dim to be a multiple of {multiple}, got shape {list(shape)}")


def pack_bits(u: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned codes along the last dim as a little-endian bit stream: code k of a row at bits [k*b, k*b+b).

    Runs of 8 codes fill exactly ``bits`` bytes, so the last dim must be a multiple of 8.
    """
    lead, c = u.shape[:-1], u.shape[-1]
    g = u.reshape(*lead, c // 8, 8).astype(np.uint64)
    acc = np.zeros(g.shape[:-1], dtype=np.uint64)
    for k in range(8):
        acc |= g[..., k] << np.uint64(bits * k)
    out = np.stack([(acc >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(bits)], axis=-1)
    return out.astype(np.uint8).reshape(*lead, c * bits // 8)


def unpack_bits(packed: np.ndarray, bits: int, c: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: uint8 [..., c*bits/8] -> codes uint8 [..., c]."""
    lead = packed.shape[:-1]
    b = packed.reshape(*lead, c // 8, bits).astype(np.uint64)
    acc = np.zeros(b.shape[:-1], dtype=np.uint64)
    for i in range(bits):
        acc |= b[..., i] << np.uint64(8 * i)
    mask = np.uint64((1 << bits) - 1)
    codes = np.stack([(acc >> np.uint64(bits * k)) & mask for k in range(8)], axis=-1)
    return codes.astype(np.uint8).reshape(*lead, c)
