"""The quantizing recipes by name (``--quantize``): which parameters each quantizes, into which format, which fused
parents it forms and what each Use may run with (``docs/quantization.md``, "Recipes").

Only the standard library: the CLI takes its ``--quantize`` choices from RECIPES without importing numpy or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

RECIPES = ("fp8", "q4", "q5", "nvfp4")


@dataclass(frozen=True)
class Recipe:
    name: str
    format: str
    dtype: str
    params: Mapping[str, Any]
    row_granularity: int  # fused-parent member boundaries must be multiples of this (block FP8: 128)
    activation: str
    # (parent suffix, member suffixes) per module prefix; the attention entry differs for q4
    groups: tuple[tuple[str, tuple[str, ...]], ...]
    dtype_overrides: Mapping[str, str] = field(default_factory=dict)  # member suffix -> dtype


_ATTN_QKV = ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"))
_OTHER = (("linear_attn.in_proj_qkvz", ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z")),
          ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
          ("mlp.shared_expert.gate_up_proj", ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj")))


def recipe(name: str, group_size: int = 128) -> Recipe:
    g = {"group_size": group_size}
    if name == "fp8":
        return Recipe(name, "fp8_e4m3", "float8_e4m3fn", {"block": [128, 128]}, 128, "AllowA8", (_ATTN_QKV, *_OTHER))
    if name == "q4":
        # Q/K in an int4 parent, V alone in int5: the two-weight projection entry (q_proj carries the gate rows).
        qk = ("self_attn.qk_proj", ("self_attn.q_proj", "self_attn.k_proj"))
        return Recipe(name, "int_group", "int4", g, 1, "A16Only", (qk, *_OTHER), {"self_attn.v_proj": "int5"})
    if name == "q5":
        return Recipe(name, "int_group", "int5", g, 1, "A16Only", (_ATTN_QKV, *_OTHER))
    if name == "nvfp4":
        return Recipe(name, "nvfp4", "nvfp4", {}, 1, "A16Only", (_ATTN_QKV, *_OTHER))
    raise ValueError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
