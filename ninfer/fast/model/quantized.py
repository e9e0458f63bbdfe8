"""The quantized parameters of an artifact as the fast model's device weights (``QuantWeight``), and the start-up
check that every quantized representation has a fast kernel.

A binding in a non-dense format becomes a QuantWeight built from its planes (the stored bytes, uploaded as they are;
``ninfer.fast.ops.qlinear.layout`` lists the two exact re-layouts). Its ``a8`` flag is the intersection of its Uses'
activation permissions (every Use must allow A8). Only projections, the router, the routed experts and an untied
lm_head have quantized kernels; any other quantized parameter (embedding, norms, conv, fp32 parameters), or a layout
the kernels do not tile, fails at start with the binding, its object and its format named.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ninfer.artifact import ACTIVATIONS
from ninfer.artifact.formats import TORCH_DTYPES
from ninfer.errors import NotSupportedError
from ninfer.fast.ops.qlinear import QuantWeight, from_planes
from ninfer.fast.ops.qlinear.layout import unsupported
from ninfer.models.qwen3_5 import Qwen35Config
from ninfer.models.qwen3_5 import draft_quant as dq

_QUANT_KINDS = ("linear", "router", "experts")


def _describe(o) -> str:
    return f"{o.format} {o.dtype}" + (f" {o.params}" if o.params else "")


def _planes(art: Any, name: str, device) -> dict[str, torch.Tensor]:
    b = art.bindings[name]
    specs = {p.name: p for p in art.objects[b.object].planes}
    out = {}
    for pname, arr in art.planes(name).items():
        t = torch.from_numpy(np.ascontiguousarray(arr)).view(TORCH_DTYPES[specs[pname].dtype])
        out[pname] = t.to(device)
    return out


def _a8(art: Any, name: str) -> bool:
    uses = art.uses_of(name)
    return bool(uses) and all("A8" in ACTIVATIONS[u.activation] for u in uses)


def quantized_bindings(art: Any, tied: bool) -> dict[str, Any]:
    """Text bindings in a non-dense format -> their object; raises NotSupportedError for one without a kernel."""
    out = {}
    for name, b in art.bindings.items():
        o = art.objects[b.object]
        if o.format == "dense" or b.feature != "text":
            continue
        where = f"binding {name!r} (object {o.name!r}, {_describe(o)})"
        if b.kind not in _QUANT_KINDS and not (name == "lm_head.weight" and not tied):
            raise NotSupportedError(f"the fast Program has no quantized kernel for {b.kind} parameters: {where}; "
                                    "store it dense (ninfer convert --keep) or run it on --program reference")
        why = unsupported(from_planes(o.format, o.dtype, o.params, tuple(b.shape), _planes(art, name, "meta"),
                                      False))
        if why:
            raise NotSupportedError(f"the fast Program's {o.format} kernels cannot run {where}: {why}; run it on "
                                    "--program reference")
        out[name] = o
    return out


def artifact_quant(art: Any, device, tied: bool) -> tuple[Callable[[str], QuantWeight | None], list[str]]:
    """``quant(logical_name)`` for ``load_fast_weights`` (uploads the planes on demand), and the quantized names."""
    objects = quantized_bindings(art, tied)

    def quant(name: str) -> QuantWeight | None:
        o = objects.get(name)
        if o is None:
            return None
        b = art.bindings[name]
        return from_planes(o.format, o.dtype, o.params, tuple(b.shape), _planes(art, name, device), _a8(art, name))

    return quant, sorted(objects)


def draft_fp8(cfg: Qwen35Config, src: Callable[[str], torch.Tensor], device) -> Callable[[str], QuantWeight | None]:
    """``quant`` for the MTP head under ``"quantization": "fp8"`` (`ninfer.models.qwen3_5.draft_quant`): each of its
    projections an FP8 QuantWeight with one scale per row, packed from the source's values as the reference
    Program packs them (decode only: a8 off, so a prefill's MTP advance dequantizes exactly)."""
    names = set(dq.draft_linears(cfg))

    def quant(name: str) -> QuantWeight | None:
        return fp8_weight(src(name), device) if name in names else None
    return quant


def fp8_weight(weight: torch.Tensor, device) -> QuantWeight:
    """`weight` [N, K] as an FP8 QuantWeight on `device`, one scale per row (`draft_quant.fp8_planes`)."""
    planes = dq.fp8_planes(weight)
    data = torch.from_numpy(planes["data"]).view(torch.float8_e4m3fn).to(device)
    scales = torch.from_numpy(planes["scales"]).to(device)
    return from_planes(dq.FORMAT.name, dq.DTYPE, dq.PARAMS, tuple(data.shape), {"data": data, "scales": scales},
                       False)
