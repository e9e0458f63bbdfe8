"""Import of a published quantized checkpoint: its quantized modules as objects of ninfer's representations.

The value-preserving path (``plan.py``) converts every other tensor; the two plans together cover the config's
logical parameters. Per-expert quantized MoE matrices are stacked into the logical 3-D experts parameters.
"""

from __future__ import annotations

from ninfer.convert.hf_source import HFSource, expert_key, logical_name
from ninfer.models.qwen3_5.params import MTP, TEXT, VISION, logical_parameters

from .modules import Module, find_modules
from .objects import QuantObject, import_object
from .parts import PartReader
from .scheme import Scheme

# FP8 KV-cache scales (ModelOpt's kv_cache_quant_algo): ninfer keeps the KV cache in bf16, so they have no consumer.
KV_SCALES = (".k_scale", ".v_scale")
_EXPERT_PARTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


def _expert_parts(modules: dict[str, Module], name: str, experts: int, problems: list[str], covered: set[str]
                  ) -> list[Module] | None:
    """``layers.3.mlp.experts.gate_up_proj`` <- e0 gate, e0 up, e1 gate, ... (None: no expert is quantized)."""
    base, proj = name.rsplit(".", 1)
    wanted = [f"{base}.{e}.{p}.weight" for e in range(experts) for p in _EXPERT_PARTS[proj]]
    if not any(w in modules for w in wanted):
        return None
    missing = [w for w in wanted if w not in modules]
    if missing:
        problems.append(f"quantized experts of {name!r} are incomplete: no quantized {missing[0]!r}"
                        f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}")
        for w in wanted:
            modules.pop(w, None)
        covered.add(name)
        return None
    return [modules.pop(w) for w in wanted]


def plan_import(src: HFSource, scheme: Scheme
                ) -> tuple[list[QuantObject], frozenset[str], frozenset[str], list[str]]:
    """The quantized objects in execution order, the checkpoint keys and logical parameters they cover (failed
    ones too, so the value-preserving plan does not report them missing again), and every problem found."""
    modules, problems, claimed = find_modules(src, scheme)
    claimed |= {k for k in src.tensors if k.endswith(KV_SCALES)}
    reader = PartReader(src, scheme)
    has_mtp = any(k.startswith("mtp.") for k in src.tensors)
    # A quantized vision tower (its linears) is imported like the text ones, as the vision feature.
    has_vision = src.config.vision is not None and any(m.startswith("visual.") for m in modules)
    features = (TEXT,) + ((MTP,) if has_mtp else ()) + ((VISION,) if has_vision else ())
    objects: list[QuantObject] = []
    covered: set[str] = set()
    for spec in logical_parameters(src.config, features).values():
        if spec.kind == "experts":
            parts = _expert_parts(modules, spec.name, spec.shape[0], problems, covered)
        else:
            parts = [modules.pop(spec.name)] if spec.name in modules else None
        if parts is None:
            continue
        covered.add(spec.name)
        if len(spec.shape) not in (2, 3):
            problems.append(f"tensor {parts[0].key}: quantized, but {spec.name!r} is not a matrix")
            continue
        obj = import_object(reader, spec.name, spec.feature, spec.kind, spec.shape, parts, problems)
        if obj is not None:
            objects.append(obj)
    # Modules refused in find_modules (a required field missing) are covered too: they must not read as missing.
    for key in claimed:
        name = logical_name(key.rpartition(".")[0] + ".weight")
        ek = expert_key(name) if name else None
        covered.add(f"{ek[0]}.{'down_proj' if ek[2] == 'down' else 'gate_up_proj'}" if ek else name)
    for m in modules.values():
        problems.append(f"unexpected quantized tensor {m.key} (logical name {m.logical!r} is not a parameter "
                        "of this config)")
    return objects, claimed, frozenset(covered), problems
