"""The weights of a conversion: the value-preserving plan plus the quantized objects of an import or a recipe."""

from __future__ import annotations

import dataclasses
from typing import Any

from ninfer.artifact.writer import ArtifactWriter
from ninfer.convert.errors import ConversionError
from ninfer.convert.hf_source import HFSource
from ninfer.convert.plan import Plan, plan_conversion

from .importer import KV_SCALES, plan_import
from .objects import QuantObject
from .recipe import apply_recipe
from .recipes import RECIPES, recipe
from .scheme import read_scheme

PRESERVE = "preserve"


def plan_weights(src: HFSource, dtype: str | None, quantize: str | None, keep: tuple[str, ...], group_size: int
                 ) -> tuple[Plan, list[QuantObject], dict[str, Any]]:
    """The dense plan, the quantized objects and the provenance recipe; ConversionError lists every problem."""
    if quantize is not None and quantize not in RECIPES:
        raise ConversionError(str(src.dir), [f"--quantize {quantize!r} is not a recipe (known: {list(RECIPES)})"])
    scheme = read_scheme(src.raw_config, str(src.dir / "config.json"))
    if scheme is not None:
        if quantize is not None or keep:
            raise ConversionError(str(src.dir), [f"--quantize/--keep: the checkpoint is already quantized "
                                                 f"(quantization_config.quant_method {scheme.method.value!r})"])
        quantized, claimed, covered, problems = plan_import(src, scheme)
        plan = plan_conversion(src, dtype, skip=claimed, provided=covered)
        problems = [*problems, *plan.problems]
        rec = {"name": "import", "method": scheme.method.value, "dtype": dtype or "source",
               "unused_kv_cache_scales": sum(k.endswith(KV_SCALES) for k in src.tensors)}
    else:
        plan = plan_conversion(src, dtype)
        problems, quantized = list(plan.problems), []
        rec = {"name": PRESERVE, "dtype": dtype or "source"}
        if plan.problems:
            raise ConversionError(str(src.dir), problems)
        if quantize is not None:
            items, quantized, problems = apply_recipe(src, plan, recipe(quantize, group_size), keep)
            plan = dataclasses.replace(plan, items=tuple(items))
            rec = {"name": quantize, "dtype": dtype or "source", "keep": list(keep),
                   **({"group_size": group_size} if quantize in ("q4", "q5") else {})}
        elif keep:
            problems = ["--keep needs --quantize"]
    if problems:
        raise ConversionError(str(src.dir), problems)
    return plan, quantized, rec


def add_quantized(w: ArtifactWriter, obj: QuantObject) -> None:
    """Write one quantized object and bind its members (row views of a fused parent, or the whole object)."""
    w.add_object(obj.name, format=obj.format, dtype=obj.dtype, shape=obj.shape, planes=obj.planes(),
                 params=obj.params)
    if len(obj.members) == 1:
        w.bind(obj.members[0][0], obj.name, feature=obj.feature, kind=obj.kind)
        return
    start = 0
    for name, rows in obj.members:
        w.bind(name, obj.name, feature=obj.feature, kind=obj.kind, rows=(start, start + rows))
        start += rows
