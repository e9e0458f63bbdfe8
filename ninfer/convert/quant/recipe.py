"""Applying a quantizing recipe (recipes.py) to a bf16/fp32 checkpoint, with ``--keep`` overrides.

Values come from the value-preserving plan's items, so the source mapping, expert fusion and shape checks are the
bf16 path's.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Mapping

import numpy as np
import torch

from ninfer.artifact.formats import get_format
from ninfer.convert.hf_source import HFSource
from ninfer.convert.plan import Item, Plan

from .objects import Part, QuantObject
from .recipes import Recipe

# Kept at the source dtype by every recipe: tiny per-head gates feeding exp/softplus, and the 1-row expert gate.
ALWAYS_KEPT = ("*.linear_attn.in_proj_a.weight", "*.linear_attn.in_proj_b.weight", "*.shared_expert_gate.weight")
QUANTIZED_KINDS = ("linear", "experts")


def _suffix(name: str) -> tuple[str, str]:
    """``layers.3.self_attn.q_proj.weight`` -> (``layers.3``, ``self_attn.q_proj``); experts keep their suffix."""
    parts = name.removesuffix(".weight").split(".")
    cut = 3 if parts[:2] == ["mtp", "layers"] else 2 if parts[0] == "layers" else 1
    return ".".join(parts[:cut]), ".".join(parts[cut:])


class _Values:
    """fp32 values of the recipe's items, one 2-D matrix or one expert's slab [rows, K] at a time. A fused 3-D
    source tensor is read once and kept until the next one is asked for (its experts are packed in order)."""

    def __init__(self, src: HFSource):
        self.src = src
        self._held: tuple[str, torch.Tensor] | None = None

    def _whole(self, key: str) -> torch.Tensor:
        if self._held is None or self._held[0] != key:
            self._held = None  # drop the previous tensor before reading the next
            self._held = (key, self.src.get(key))
        return self._held[1]

    def __call__(self, item: Item, expert: int | None) -> np.ndarray:
        if expert is None:
            return self.src.get(item.keys[0]).float().numpy()
        if len(item.keys) == 1:
            return self._whole(item.keys[0])[expert].float().numpy()
        per = len(item.keys) // item.shape[0]
        keys = item.keys[expert * per:(expert + 1) * per]
        return torch.cat([self.src.get(k) for k in keys]).float().numpy()


def _pack_part(values: _Values, members: list[Item], fmt: str, dtype: str, params: Mapping[str, Any],
               expert: int | None) -> Part:
    def part() -> dict[str, np.ndarray]:
        x = np.concatenate([values(m, expert) for m in members], axis=0)
        return get_format(fmt).pack(x, dtype, params)
    return part


def _check(rec: Recipe, item: Item, dtype: str, problems: list[str]) -> None:
    k = item.shape[-1]
    if rec.format == "int_group" and k % rec.params["group_size"]:
        problems.append(f"tensor {item.name}: --group-size {rec.params['group_size']} does not divide its input "
                        f"dim {k} (recipe {rec.name})")
    if rec.format == "nvfp4" and k % 16:
        problems.append(f"tensor {item.name}: nvfp4 needs the input dim to be a multiple of 16, got {k}")


def _object(values: _Values, rec: Recipe, name: str, members: list[Item], dtype: str) -> QuantObject:
    first = members[0]
    if len(first.shape) == 3:
        params = dict(rec.params)
        parts = tuple(_pack_part(values, members, rec.format, dtype, rec.params, e) for e in range(first.shape[0]))
        if rec.format == "nvfp4":
            params["global_rows"] = first.shape[1]  # one global scale per expert
    else:
        params = dict(rec.params)
        parts = (_pack_part(values, members, rec.format, dtype, rec.params, None),)
    shape = (sum(m.shape[0] for m in members), *first.shape[1:]) if len(first.shape) == 2 else first.shape
    return QuantObject(name, first.feature, first.kind, tuple((m.name, m.shape[0]) for m in members), rec.format,
                       dtype, tuple(shape), params, rec.activation, parts)


def apply_recipe(src: HFSource, plan: Plan, rec: Recipe, keep: tuple[str, ...]
                 ) -> tuple[list[Item], list[QuantObject], list[str]]:
    """Split the plan's items into those kept dense and the quantized objects replacing the others."""
    values = _Values(src)
    problems = [f"--keep {p!r} matches no parameter the recipe quantizes" for p in keep
                if not any(fnmatch.fnmatchcase(i.name, p) for i in plan.items if _quantizable(i))]
    chosen = {i.name: i for i in plan.items if _quantizable(i) and not any(fnmatch.fnmatchcase(i.name, p)
                                                                         for p in keep)}
    by_slot = {_suffix(n): i for n, i in chosen.items()}
    dtype_of = {n: rec.dtype_overrides.get(_suffix(n)[1], rec.dtype) for n in chosen}
    objects: dict[str, QuantObject] = {}
    for prefix in dict.fromkeys(_suffix(n)[0] for n in chosen):
        for parent, suffixes in rec.groups:
            members = [by_slot.get((prefix, s)) for s in suffixes]
            if None in members or len({dtype_of[m.name] for m in members}) > 1:
                continue
            bounds = np.cumsum([m.shape[0] for m in members])[:-1]
            if any(b % rec.row_granularity for b in bounds):
                continue  # a view would cut a scale block: store the members alone
            for m in members:
                _check(rec, m, dtype_of[m.name], problems)
            objects[members[0].name] = _object(values, rec, f"{prefix}.{parent}", members,
                                               dtype_of[members[0].name])
            for m in members:
                chosen.pop(m.name)
    for n, item in chosen.items():
        _check(rec, item, dtype_of[n], problems)
        objects[n] = _object(values, rec, n, [item], dtype_of[n])
    quantized = {m for o in objects.values() for m, _ in o.members}
    dense = [i for i in plan.items if i.name not in quantized]
    order = {i.name: k for k, i in enumerate(plan.items)}
    return dense, sorted(objects.values(), key=lambda o: order[o.members[0][0]]), problems


def _quantizable(item: Item) -> bool:
    return (item.kind in QUANTIZED_KINDS and len(item.shape) >= 2 and item.feature in ("text", "mtp")
            and not any(fnmatch.fnmatchcase(item.name, p) for p in ALWAYS_KEPT))
