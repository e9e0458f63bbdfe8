"""Match a checkpoint's tensors to the config's logical parameters and decide what each object will hold.

The plan is built from safetensors headers alone, so every missing, unexpected, mis-shaped or unsupported tensor is
found (and reported together) before a byte of output is written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ninfer.artifact.formats import ITEMSIZE
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.params import MTP, TEXT, VISION, ParamSpec, logical_parameters

from .hf_source import SOURCE_DTYPES, HFSource, expert_key, logical_name

DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Item:
    """One dense object: the bytes of ``keys`` concatenated in order (per-expert keys fuse into one parent)."""

    name: str
    feature: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    keys: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        n = ITEMSIZE[self.dtype]
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class Plan:
    config: Qwen35Config
    items: tuple[Item, ...]
    tied: bool
    tie_reason: str | None
    problems: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return sum(i.nbytes for i in self.items)


def _target_dtype(kind: str, source: str, dtype: str | None) -> str:
    # A_log and dt_bias are always fp32: the GDN decay exp(A_log) * softplus(...) is computed in fp32.
    if kind == "fp32":
        return "float32"
    return dtype or SOURCE_DTYPES.get(source, "float32")


class _Matcher:
    """Mutable bookkeeping while matching; only :func:`plan_conversion` uses it."""

    def __init__(self, src: HFSource, skip: frozenset[str]):
        self.src = src
        self.problems: list[str] = []
        self.names: dict[str, str] = {}  # logical name -> checkpoint key
        self.experts: dict[str, dict[tuple[int, str], str]] = {}  # fused base -> (expert, proj) -> key
        for key, t in src.tensors.items():
            if key in skip:
                continue
            if t.dtype not in SOURCE_DTYPES:
                self.problems.append(f"tensor {key!r} has unsupported dtype {t.dtype} (expected BF16, F16 or F32)")
            name = logical_name(key)
            if name is None:
                self.problems.append(f"unexpected tensor {key!r} (no Qwen3.5 logical name)")
            elif (ek := expert_key(name)) is not None:
                self.experts.setdefault(ek[0], {})[(ek[1], ek[2])] = key
            elif name in self.names:
                self.problems.append(f"tensors {self.names[name]!r} and {key!r} both map to {name!r}")
            else:
                self.names[name] = key

    def shape_of(self, key: str) -> tuple[int, ...]:
        return self.src.tensors[key].shape

    def single(self, spec: ParamSpec, dtype: str | None) -> Item | None:
        key = self.names.pop(spec.name)
        if self.shape_of(key) != spec.shape:
            self.problems.append(f"tensor {key!r} has shape {list(self.shape_of(key))}, expected {list(spec.shape)}")
            return None
        return Item(spec.name, spec.feature, spec.kind, spec.shape,
                    _target_dtype(spec.kind, self.src.tensors[key].dtype, dtype), (key,))

    def fused_experts(self, spec: ParamSpec, dtype: str | None) -> Item | None:
        """``experts.gate_up_proj`` [E, 2Im, H] from E x (gate [Im, H], up [Im, H]); ``down_proj`` [E, H, Im]."""
        base, proj = spec.name.rsplit(".", 1)
        group = self.experts.get(base, {})
        E = spec.shape[0]
        parts = ("gate", "up") if proj == "gate_up_proj" else ("down",)
        want = (spec.shape[1] // len(parts), *spec.shape[2:])
        keys, ok = [], True
        for e in range(E):
            for part in parts:
                key = group.pop((e, part), None)
                if key is None:
                    self.problems.append(f"missing tensor for {spec.name!r}: expert {e} {part}_proj")
                    ok = False
                elif self.shape_of(key) != want:
                    self.problems.append(f"tensor {key!r} has shape {list(self.shape_of(key))}, expected {list(want)}")
                    ok = False
                else:
                    keys.append(key)
        if not ok:
            return None
        src_dtype = self.src.tensors[keys[0]].dtype
        return Item(spec.name, spec.feature, spec.kind, spec.shape, _target_dtype(spec.kind, src_dtype, dtype), tuple(keys))

    def leftovers(self) -> None:
        for name, key in self.names.items():
            self.problems.append(f"unexpected tensor {key!r} (logical name {name!r} is not a parameter of this config)")
        for base, group in self.experts.items():
            for (e, part), key in sorted(group.items()):
                self.problems.append(f"unexpected tensor {key!r} (expert {e} {part}_proj of {base!r})")


def plan_conversion(src: HFSource, dtype: str | None = None, skip: frozenset[str] = frozenset(),
                    provided: frozenset[str] = frozenset()) -> Plan:
    """Every dense object of the artifact, in execution order (text, MTP, vision), plus all problems found.

    ``skip``: checkpoint keys another path converts (a quantized import's modules); ``provided``: the logical
    parameters that path binds, which are then not missing here."""
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES} or None, got {dtype!r}")
    m = _Matcher(src, skip)
    cfg = src.config
    tie_reason = "config" if cfg.tie_word_embeddings else None
    if not cfg.tie_word_embeddings and "lm_head.weight" not in (*m.names, *provided):
        cfg, tie_reason = dataclasses.replace(cfg, tie_word_embeddings=True), "lm_head.weight absent"
    if cfg.tie_word_embeddings:
        # A tied checkpoint may still carry a copy of the embedding as lm_head; the artifact stores it once.
        m.names.pop("lm_head.weight", None)
    has_mtp = any(n.startswith("mtp.") for n in (*m.names, *m.experts, *provided))
    # Vision is optional like MTP: a checkpoint without any visual.* tensor converts to a text-only artifact.
    has_vision = cfg.vision is not None and any(n.startswith("visual.") for n in m.names)
    features = (TEXT,) + ((MTP,) if has_mtp else ()) + ((VISION,) if has_vision else ())
    items: list[Item] = []
    for spec in logical_parameters(cfg, features).values():
        if (spec.name == "lm_head.weight" and cfg.tie_word_embeddings) or spec.name in provided:
            continue
        if spec.name in m.names:
            item = m.single(spec, dtype)
        elif spec.kind == "experts" and spec.name.rsplit(".", 1)[0] in m.experts:
            item = m.fused_experts(spec, dtype)
        else:
            m.problems.append(f"missing tensor {spec.name!r} ({spec.feature}, shape {list(spec.shape)})")
            item = None
        if item is not None:
            items.append(item)
    m.leftovers()
    return Plan(cfg, tuple(items), cfg.tie_word_embeddings, tie_reason, tuple(m.problems))
