"""Random quantized weights made directly on the device, in the stored layouts of the artifact formats (FP8 e4m3
with 128x128 block scales, int4 groups of 128, NVFP4), for the quantized benchmark: timing needs only finite values
of a realistic magnitude, so the planes are random codes with scales that give projections std gain/sqrt(fan_in).

Quantized as the converter's recipes do (docs/quantization.md): every projection of the text layers and the routed
experts; the embedding, lm_head, router, shared-expert gate, GDN in_proj_b/in_proj_a, norms, conv and fp32
parameters stay dense. (The q4 recipe's int5 v_proj is int4 here.)
"""

from __future__ import annotations

import zlib

import torch

from ninfer.fast.ops.qlinear import QuantWeight, from_planes
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.params import TEXT, logical_parameters

# recipe -> (format, dtype, params, A8 allowed)
RECIPES = {
    "fp8": ("fp8_e4m3", "float8_e4m3fn", {"block": [128, 128]}, True),
    "q4": ("int_group", "int4", {"group_size": 128}, False),
    "nvfp4": ("nvfp4", "nvfp4", {}, False),
}
_KEPT = ("in_proj_a.weight", "in_proj_b.weight", "shared_expert_gate.weight")
_SMALL = {"q4": {"group_size": 32}, "fp8": {"block": [32, 32]}}  # the tiny smoke shape's widths are 64


def random_planes(fmt: str, params: dict, shape: tuple[int, ...], std: float, gen, device) -> dict[str, torch.Tensor]:
    *lead, n, k = shape
    if fmt == "fp8_e4m3":
        br, bc = params["block"]
        data = torch.randn(shape, device=device, generator=gen).mul_(64.0).clamp_(-448, 448).to(torch.float8_e4m3fn)
        scales = torch.full((*lead, -(-n // br), -(-k // bc)), std / 64.0, device=device)
        return {"data": data, "scales": scales}
    codes = torch.randint(0, 256, (*lead, n, k // 2), device=device, dtype=torch.uint8, generator=gen)
    if fmt == "int_group":
        # uniform codes -8..7 have std ~4.6
        return {"data": codes, "scales": torch.full((*lead, n, k // params["group_size"]), std / 4.6,
                                                    device=device, dtype=torch.float16)}
    # random e2m1 codes have std ~3; block scales 1, the per-tensor scale sets the magnitude
    return {"data": codes, "scales": torch.ones((*lead, n, k // 16), device=device).to(torch.float8_e4m3fn),
            "global_scale": torch.tensor([std / 3.0], device=device)}


def random_quant(cfg: Qwen35Config, device, recipe: str, gain: float = 0.25, small: bool = False):
    """``quant(logical_name) -> QuantWeight | None`` for ``FastProgram.build``."""
    fmt, dtype, params, a8 = RECIPES[recipe]
    params = _SMALL.get(recipe, params) if small else params
    specs = logical_parameters(cfg, (TEXT,))

    def quant(name: str) -> QuantWeight | None:
        spec = specs[name]
        if spec.kind not in ("linear", "experts") or name == "lm_head.weight" or name.endswith(_KEPT):
            return None
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()))
        planes = random_planes(fmt, params, spec.shape, gain * spec.shape[-1] ** -0.5, gen, device)
        return from_planes(fmt, dtype, params, spec.shape, planes, a8)

    return quant
