"""Quantized test weights: fp32 values packed by the artifact's own numpy formats, then handed to the fast kernels'
device form (``ninfer.fast.ops.qlinear.QuantWeight``), so tests exercise exactly the stored layouts."""

from __future__ import annotations

import numpy as np
import torch

from ninfer.artifact.formats import TORCH_DTYPES, get_format
from ninfer.fast.ops.qlinear import QuantWeight, from_planes

# (format, dtype, params) of every representation the fast kernels run, by short name
RECIPES = {
    "fp8": ("fp8_e4m3", "float8_e4m3fn", {"block": [128, 128]}),
    "fp8_row": ("fp8_e4m3", "float8_e4m3fn", {}),
    "int4": ("int_group", "int4", {"group_size": 128}),
    "int5": ("int_group", "int5", {"group_size": 128}),
    "nvfp4": ("nvfp4", "nvfp4", {}),
}


def torch_planes(np_planes: dict[str, np.ndarray], specs, device) -> dict[str, torch.Tensor]:
    """numpy planes (bf16/fp8 as unsigned bits) -> torch tensors of the planes' own dtypes on ``device``."""
    out = {}
    for spec in specs:
        arr = np.ascontiguousarray(np_planes[spec.name]).reshape(spec.shape)
        out[spec.name] = torch.from_numpy(arr).view(TORCH_DTYPES[spec.dtype]).to(device)
    return out


def pack_weight(values: torch.Tensor, recipe: str, device="cpu", a8: bool = False,
                params: dict | None = None) -> QuantWeight:
    """fp32 values [.., N, K] quantized by ``RECIPES[recipe]`` (``params`` overrides its params)."""
    fmt_name, dtype, default = RECIPES[recipe]
    params = default if params is None else params
    fmt = get_format(fmt_name)
    shape = tuple(values.shape)
    planes = fmt.pack(values.detach().float().cpu().numpy(), dtype, params)
    return from_planes(fmt_name, dtype, params, shape, torch_planes(planes, fmt.planes(shape, dtype, params), device),
                       a8)
