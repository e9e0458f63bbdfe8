"""The quantization scheme of a published checkpoint, read once from ``config.json``'s ``quantization_config``.

Only the config decides the method; the tensor names then have to agree with it (``modules.py``). An unknown method
or an unsupported field value is refused here, naming the field.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from ninfer.convert.errors import ConversionError


class Method(enum.Enum):
    FP8_BLOCK = "fp8"
    GPTQ = "gptq"
    AWQ = "awq"
    PACKED = "compressed-tensors"
    NVFP4 = "modelopt"


@dataclass(frozen=True)
class Scheme:
    """What the importer needs of a quantization_config; fields a method does not use keep their defaults."""

    method: Method
    bits: int = 0
    group_size: int = 0  # 0: per channel (the whole reduction dim)
    act_order: bool = False  # g_idx required
    gptq_v1: bool = False  # zeros stored minus one
    block: tuple[int, int] = (0, 0)
    symmetric: bool = True
    ignore: tuple[str, ...] = ()

    @property
    def activation(self) -> str:
        """The activation permission of the Uses of this scheme's quantized weights (docs/quantization.md)."""
        if self.method is Method.FP8_BLOCK:
            return "AllowA8"
        if self.method is Method.NVFP4:
            return "AllowA4"
        return "A16Only"


def _field(where: str, qc: Mapping[str, Any], name: str, allowed: tuple, default: Any = None) -> Any:
    value = qc.get(name, default)
    if value not in allowed:
        raise ConversionError(where, [f"quantization_config.{name}: {value!r} is not supported (expected one of "
                                      f"{list(allowed)})"])
    return value


def _group(where: str, qc: Mapping[str, Any], name: str = "group_size") -> int:
    g = qc.get(name, -1)
    if not isinstance(g, int) or isinstance(g, bool) or (g <= 0 and g != -1) or (g > 0 and g % 8):
        raise ConversionError(where, [f"quantization_config.{name}: {g!r} is not -1 or a positive multiple of 8"])
    return max(g, 0)


def _fp8(where: str, qc: Mapping[str, Any]) -> Scheme:
    _field(where, qc, "fmt", ("e4m3",), "e4m3")
    _field(where, qc, "activation_scheme", ("dynamic",), "dynamic")
    block = qc.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ConversionError(where, [f"quantization_config.weight_block_size: {block!r} is not two positive ints "
                                      "(per-tensor FP8 checkpoints are not supported)"])
    return Scheme(Method.FP8_BLOCK, bits=8, block=(block[0], block[1]),
                  ignore=tuple(qc.get("modules_to_not_convert") or ()))


def _gptq(where: str, qc: Mapping[str, Any]) -> Scheme:
    bits = _field(where, qc, "bits", (4, 8))
    fmt = _field(where, qc, "checkpoint_format", ("gptq", "gptq_v2"), "gptq")
    return Scheme(Method.GPTQ, bits=bits, group_size=_group(where, qc), act_order=bool(qc.get("desc_act", False)),
                  gptq_v1=fmt == "gptq", symmetric=bool(qc.get("sym", True)),
                  ignore=tuple(qc.get("modules_to_not_convert") or ()))


def _awq(where: str, qc: Mapping[str, Any]) -> Scheme:
    _field(where, qc, "version", ("gemm", "GEMM"), "gemm")
    bits = _field(where, qc, "bits", (4,), qc.get("w_bit", 4))
    _field(where, qc, "zero_point", (True,), True)
    g = qc.get("group_size", qc.get("q_group_size", -1))
    return Scheme(Method.AWQ, bits=bits, group_size=_group(where, {"group_size": g}), symmetric=False,
                  ignore=tuple(qc.get("modules_to_not_convert") or ()))


def _packed(where: str, qc: Mapping[str, Any]) -> Scheme:
    groups = qc.get("config_groups") or {}
    weights = [dict((g or {}).get("weights") or {}) for g in groups.values()]
    if not weights or any(w != weights[0] for w in weights):
        raise ConversionError(where, ["quantization_config.config_groups: expected one weight scheme shared by "
                                      f"every group, got {len(set(map(str, weights)))}"])
    formats = {qc.get("format")} | {(g or {}).get("format") for g in groups.values()} - {None}
    if formats != {"pack-quantized"}:
        raise ConversionError(where, [f"quantization_config.format: {sorted(formats)} is not supported "
                                      "(expected 'pack-quantized')"])
    for g in groups.values():
        if (g or {}).get("input_activations") is not None:
            raise ConversionError(where, ["quantization_config.config_groups.*.input_activations: activation "
                                          "quantization is not supported (weight-only schemes are)"])
    w, wh = weights[0], "quantization_config.config_groups.*.weights"
    bits = _field(where, w, "num_bits", (4, 8))
    _field(where, w, "type", ("int",), "int")
    strategy = _field(where, w, "strategy", ("group", "channel"))
    actorder = _field(where, w, "actorder", (None, "group", "weight", "static", "dynamic"))
    g = _group(wh, w) if strategy == "group" else 0
    return Scheme(Method.PACKED, bits=bits, group_size=g, act_order=actorder in ("group", "dynamic"),
                  symmetric=bool(w.get("symmetric", True)), ignore=tuple(qc.get("ignore") or ()))


def _nvfp4(where: str, qc: Mapping[str, Any]) -> Scheme:
    inner = qc.get("quantization") if isinstance(qc.get("quantization"), Mapping) else qc
    _field(where, inner, "quant_algo", ("NVFP4",))
    _field(where, inner, "group_size", (16,), 16)
    return Scheme(Method.NVFP4, bits=4, group_size=16, ignore=tuple(inner.get("exclude_modules") or ()))


_READERS = {"fp8": _fp8, "gptq": _gptq, "awq": _awq, "compressed-tensors": _packed, "modelopt": _nvfp4}


def read_scheme(raw_config: Mapping[str, Any], where: str) -> Scheme | None:
    """The scheme of an HF config (top level or ``text_config``), or None when it has no quantization_config."""
    qc = raw_config.get("quantization_config")
    if qc is None and isinstance(raw_config.get("text_config"), Mapping):
        qc = raw_config["text_config"].get("quantization_config")
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, Mapping) else None
    if method not in _READERS:
        raise ConversionError(where, [f"quantization_config.quant_method: {method!r} is not supported (known: "
                                      f"{sorted(_READERS)})"])
    return _READERS[method](where, qc)
