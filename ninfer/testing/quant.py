"""Quantized test weights: fp32 values packed by the artifact's own numpy formats, then handed to the fast kernels'
device form (``ninfer.fast.ops.qlinear.QuantWeight``), so tests exercise exactly the stored layouts.

The formats' ``pack`` writes neither act-order nor per-row-group NVFP4 global scales (those come from imports), so
``pack_planes`` builds them the way an import stores them: act-order packs the columns in a random stored order and
records it in ``perm``; ``global_rows`` packs each r-row block with its own global scale."""

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
    "int8": ("int_group", "int8", {"group_size": 128}),
    "int4_zp": ("int_group", "int4", {"group_size": 128, "zero_point": True, "scale_dtype": "bfloat16"}),
    "int4_act": ("int_group", "int4", {"group_size": 128, "zero_point": True, "act_order": True}),
    "nvfp4": ("nvfp4", "nvfp4", {}),
    "nvfp4_rows": ("nvfp4", "nvfp4", {"global_rows": 1, "input_scale": True}),
}


def torch_planes(np_planes: dict[str, np.ndarray], specs, device) -> dict[str, torch.Tensor]:
    """numpy planes (bf16/fp8 as unsigned bits) -> torch tensors of the planes' own dtypes on ``device``."""
    out = {}
    for spec in specs:
        arr = np.ascontiguousarray(np_planes[spec.name]).reshape(spec.shape)
        out[spec.name] = torch.from_numpy(arr).view(TORCH_DTYPES[spec.dtype]).to(device)
    return out


def pack_planes(values: np.ndarray, fmt_name: str, dtype: str, params: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """The numpy planes of ``values`` [.., N, K] in (format, dtype, params), act-order and global_rows included."""
    fmt = get_format(fmt_name)
    base = {k: v for k, v in params.items() if k not in ("act_order", "global_rows", "input_scale")}
    if params.get("act_order"):
        rng = np.random.default_rng(seed)
        lead = values.shape[:-2]
        perm = np.stack([rng.permutation(values.shape[-1]) for _ in range(int(np.prod(lead)))]).astype(np.int32)
        perm = perm.reshape(*lead, values.shape[-1])
        stored = np.take_along_axis(values, np.broadcast_to(perm[..., None, :], values.shape), axis=-1)
        return {**fmt.pack(stored, dtype, base), "perm": perm}
    if params.get("global_rows"):
        r = int(params["global_rows"])
        chunks = [fmt.pack(values[..., i:i + r, :], dtype, base) for i in range(0, values.shape[-2], r)]
        out = {k: np.concatenate([c[k] for c in chunks], axis=-2) for k in ("data", "scales")}
        g = np.stack([c["global_scale"].reshape(()) for c in chunks], axis=-1).astype(np.float32)
        out["global_scale"] = np.broadcast_to(g, (*values.shape[:-2], g.shape[-1])).copy()
        if params.get("input_scale"):
            out["input_scale"] = np.ones_like(out["global_scale"])
        return out
    return fmt.pack(values, dtype, base)


def pack_weight(values: torch.Tensor, recipe: str, device="cpu", a8: bool = False,
                params: dict | None = None) -> QuantWeight:
    """fp32 values [.., N, K] quantized by ``RECIPES[recipe]`` (``params`` overrides its params)."""
    fmt_name, dtype, default = RECIPES[recipe]
    params = default if params is None else params
    fmt = get_format(fmt_name)
    shape = tuple(values.shape)
    planes = pack_planes(values.detach().float().cpu().numpy(), fmt_name, dtype, params)
    return from_planes(fmt_name, dtype, params, shape, torch_planes(planes, fmt.planes(shape, dtype, params), device),
                       a8)
