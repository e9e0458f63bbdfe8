"""Numeric formats of artifact objects: dense, fp8 e4m3, group int4/int5, NVFP4.

Each format turns (logical shape, dtype, params) into named planes; see ``docs/artifact-format.md`` for the byte
layout of each.
"""

from __future__ import annotations

from .base import Format
from .dense import Dense, Raw
from .fp8 import FP8E4M3
from .intq import IntGroup
from .nvfp4 import NVFP4
from .planes import ITEMSIZE, NUMPY_DTYPES, PLANE_ALIGN, TORCH_DTYPES, PlaneSpec, align_up, layout

FORMATS: dict[str, Format] = {f.name: f for f in (Dense(), Raw(), FP8E4M3(), IntGroup(), NVFP4())}


def get_format(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; known: {sorted(FORMATS)}") from None


__all__ = ["FORMATS", "Format", "get_format", "PlaneSpec", "layout", "align_up", "PLANE_ALIGN", "ITEMSIZE",
           "NUMPY_DTYPES", "TORCH_DTYPES"]
