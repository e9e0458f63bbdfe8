"""Which checkpoint tensors form quantized modules, found from the tensor names and dtypes a scheme implies.

A module is quantized when its anchor tensor is present in the scheme's dtype (``qweight`` I32 for GPTQ/AWQ,
``weight_packed`` for compressed-tensors, an F8_E4M3 ``weight`` for block FP8, a U8 ``weight`` for NVFP4); its other
fields are then required or optional per scheme. Every other tensor (the modules the checkpoint leaves unquantized)
goes to the ordinary value-preserving path.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.convert.hf_source import HFSource, SourceTensor, logical_name

from .scheme import Method, Scheme


@dataclass(frozen=True)
class Fields:
    anchor: str
    anchor_dtype: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()

    @property
    def all(self) -> tuple[str, ...]:
        return (self.anchor, *self.required, *self.optional)


FIELDS = {
    Method.FP8_BLOCK: Fields("weight", "F8_E4M3", ("weight_scale_inv",)),
    Method.GPTQ: Fields("qweight", "I32", ("qzeros", "scales"), ("g_idx",)),
    Method.AWQ: Fields("qweight", "I32", ("qzeros", "scales")),
    Method.PACKED: Fields("weight_packed", "I32", ("weight_scale",), ("weight_zero_point", "weight_g_idx",
                                                                       "weight_shape")),
    Method.NVFP4: Fields("weight", "U8", ("weight_scale", "weight_scale_2"), ("input_scale",)),
}


@dataclass(frozen=True)
class Module:
    """One quantized source matrix: its checkpoint prefix and the tensors of each field."""

    key: str  # checkpoint module prefix, e.g. model.layers.0.self_attn.q_proj
    logical: str  # logical weight name (per-expert names for MoE experts)
    tensors: dict[str, SourceTensor]

    def field(self, name: str) -> SourceTensor | None:
        return self.tensors.get(name)


def find_modules(src: HFSource, scheme: Scheme) -> tuple[dict[str, Module], list[str], frozenset[str]]:
    """Quantized modules by logical weight name, the problems found (missing required fields named), and every
    checkpoint key of a quantized module (complete or not), which the value-preserving path must not see."""
    fields = FIELDS[scheme.method]
    by_module: dict[str, dict[str, SourceTensor]] = {}
    for key, t in src.tensors.items():
        prefix, _, field = key.rpartition(".")
        if field in fields.all:
            by_module.setdefault(prefix, {})[field] = t
    modules: dict[str, Module] = {}
    problems: list[str] = []
    claimed: set[str] = set()
    for prefix, tensors in sorted(by_module.items()):
        anchor = tensors.get(fields.anchor)
        if anchor is None or anchor.dtype != fields.anchor_dtype:
            if scheme.method is Method.FP8_BLOCK and "weight_scale_inv" in tensors:
                claimed.add(tensors["weight_scale_inv"].key)
                problems.append(f"tensor {prefix}.weight_scale_inv: its weight is "
                                f"{anchor.dtype if anchor else 'absent'}, expected F8_E4M3")
            continue  # an unquantized module: its tensors go the value-preserving way
        claimed.update(t.key for f, t in tensors.items())
        missing = [f for f in fields.required if f not in tensors]
        for f in missing:
            problems.append(f"tensor {prefix}.{fields.anchor} is quantized ({scheme.method.value}) but "
                            f"{prefix}.{f} is missing")
        logical = logical_name(prefix + ".weight")
        if logical is None:
            problems.append(f"unexpected tensor {prefix}.{fields.anchor} (no Qwen3.5 logical name)")
            continue
        if not missing:
            keep = {f: t for f, t in tensors.items() if f in fields.all}
            modules[logical] = Module(prefix, logical, keep)
    return modules, problems, frozenset(claimed)
