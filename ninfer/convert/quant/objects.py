"""A quantized artifact object still to be written: its format, its members (row views), and its planes made lazily.

Planes are produced part by part (one source matrix, or one expert, at a time): the first plane (``data``, the big
one) is streamed to the writer as each part is made, and the part's small planes wait in memory until the writer asks
for them, so peak memory stays near one part whatever the number of experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ninfer.artifact.formats import get_format
from ninfer.artifact.formats.planes import layout

from .modules import Module
from .parts import PartReader
from .scheme import Method

Part = Callable[[], dict[str, np.ndarray]]


@dataclass(frozen=True)
class QuantObject:
    name: str
    feature: str
    kind: str
    members: tuple[tuple[str, int], ...]  # (logical name, rows) in row order; one member: a whole-object binding
    format: str
    dtype: str
    shape: tuple[int, ...]
    params: Mapping[str, Any]
    activation: str
    parts: tuple[Part, ...]

    @property
    def nbytes(self) -> int:
        return layout(get_format(self.format).planes(self.shape, self.dtype, self.params))[1]

    def planes(self) -> dict[str, Iterable[np.ndarray]]:
        names = [p.name for p in get_format(self.format).planes(self.shape, self.dtype, self.params)]
        return streamed(self.parts, names)


def streamed(parts: Sequence[Part], names: list[str]) -> dict[str, Iterable[np.ndarray]]:
    """Plane iterables over the parts: the first plane makes each part, the others replay what it kept."""
    kept: list[dict[str, np.ndarray]] = []

    def first() -> Iterator[np.ndarray]:
        for make in parts:
            planes = make()
            kept.append({k: v for k, v in planes.items() if k != names[0]})
            yield planes[names[0]]

    def later(name: str) -> Iterator[np.ndarray]:
        for planes in kept:
            if name in planes:
                yield planes[name]

    return {names[0]: first(), **{n: later(n) for n in names[1:]}}


def _params(reader: PartReader, parts: list[Module], rows: int, k: int, three_d: bool, perm: bool,
            problems: list[str]) -> tuple[str, str, dict[str, Any]]:
    s = reader.s
    if s.method is Method.FP8_BLOCK:
        return "fp8_e4m3", "float8_e4m3fn", {"block": list(s.block)}
    if s.method is Method.NVFP4:
        has_input = {p.field("input_scale") is not None for p in parts}
        if len(has_input) > 1:
            problems.append(f"tensor {parts[0].key}: input_scale present on some experts' matrices only")
        params: dict[str, Any] = {"input_scale": True} if True in has_input else {}
        if three_d:
            params["global_rows"] = rows
        return "nvfp4", "nvfp4", params
    params = {"group_size": s.group_size or k, "scale_dtype": reader.scale_dtype(parts[0])}  # 0: per channel
    if s.method is not Method.PACKED or not s.symmetric:
        params["zero_point"] = True
    if perm:
        params["act_order"] = True
    return "int_group", f"int{s.bits}", params


def import_object(reader: PartReader, name: str, feature: str, kind: str, shape: tuple[int, ...],
                  parts: list[Module], problems: list[str]) -> QuantObject | None:
    """The object of one logical parameter from its source matrices (one, or per expert gate+up / down)."""
    experts = shape[0] if len(shape) == 3 else 1
    per = len(parts) // experts
    rows, k = shape[-2] // per, shape[-1]
    found: list[str] = []
    for p in parts:
        found += reader.check(p, rows, k)
    s = reader.s
    if s.method is Method.FP8_BLOCK and per > 1 and rows % s.block[0]:
        found.append(f"tensor {parts[0].key}.weight: {rows} rows per expert matrix is not a multiple of the "
                     f"{s.block[0]}-row FP8 block, so stacked block scales would straddle matrices")
    perms = [reader.perms.get(p.key) for p in parts]
    act = any(q is not None for q in perms)
    if act and experts > 1:
        for e in range(experts):
            group = [q if q is not None else np.arange(k, dtype=np.int32) for q in perms[e * per:(e + 1) * per]]
            if any(not np.array_equal(group[0], q) for q in group[1:]):
                found.append(f"tensor {parts[e * per].key}: act-order g_idx differs between the matrices fused "
                             f"into {name!r}")
    fmt, dtype, params = _params(reader, parts, rows, k, experts > 1, act, found)
    problems += found
    if found:
        return None

    def make(i: int) -> Part:
        def part() -> dict[str, np.ndarray]:
            planes = reader.planes(parts[i], k)
            if act and i % per == 0 and "perm" not in planes:
                planes["perm"] = np.arange(k, dtype=np.int32)
            if i % per:
                planes.pop("perm", None)  # one permutation per expert, shared by its fused matrices
            return planes
        return part

    # A4 needs the checkpoint's static input scales; NVFP4 without them runs weight-only.
    activation = "A16Only" if fmt == "nvfp4" and not params.get("input_scale") else s.activation
    return QuantObject(name, feature, kind, ((name, shape[0]),), fmt, dtype, tuple(shape), params, activation,
                       tuple(make(i) for i in range(len(parts))))
