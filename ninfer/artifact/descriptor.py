"""The JSON descriptor of a ``.ninfer`` file: objects, Bindings, Uses, resources, config, metadata, provenance.

Parsing is strict: every field is type-checked and a malformed entry raises ArtifactError naming the entry and the
field (``descriptor.objects[3].offset: ...``). Cross-references and byte bounds are checked by the reader, which also
knows the file size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .errors import ArtifactError

VERSION = 3
# A descriptor nests at most ~6 levels (objects -> planes -> shape); anything far deeper is damage or an attack, and
# refused before recursive code (parsing included) walks it.
MAX_DESCRIPTOR_DEPTH = 64
_TOO_DEEP = object()
CHECKSUM_ALGORITHM = "crc32"

# Activation permission of a Use: the activation precisions the consumer may run this weight with.
ACTIVATIONS = {"A16Only": frozenset({"A16"}), "AllowA8": frozenset({"A16", "A8"}),
               "AllowA4": frozenset({"A16", "A8", "A4"})}


@dataclass(frozen=True)
class Plane:
    name: str
    offset: int  # relative to the object's first byte
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    rows_per_entry: int


@dataclass(frozen=True)
class Object:
    """A physical byte range of the file, stored once however many Bindings point at it."""

    name: str
    offset: int
    nbytes: int
    format: str
    dtype: str
    shape: tuple[int, ...]
    params: Mapping[str, Any]
    planes: tuple[Plane, ...]
    checksum: int

    def plane(self, name: str) -> Plane:
        for p in self.planes:
            if p.name == name:
                return p
        raise ArtifactError(f"object {self.name!r}", "missing plane", f"no plane {name!r}")


@dataclass(frozen=True)
class Binding:
    """Logical parameter -> whole object, or a row view ``[rows[0], rows[1])`` along axis 0 of the object."""

    name: str
    object: str
    feature: str
    kind: str
    shape: tuple[int, ...]
    rows: tuple[int, int] | None = None
    planes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Use:
    """One consumer site of a Binding (``layers.3.self_attn.q_proj``) with its activation permission."""

    site: str
    binding: str
    feature: str
    activation: str = "A16Only"


@dataclass(frozen=True)
class Resource:
    """A Frontend blob (tokenizer JSON, chat template, generation config) stored as an object."""

    name: str
    object: str
    media_type: str


@dataclass(frozen=True)
class Descriptor:
    config: Mapping[str, Any]
    metadata: Mapping[str, Any]
    provenance: Mapping[str, Any]
    objects: tuple[Object, ...]
    bindings: tuple[Binding, ...]
    uses: tuple[Use, ...]
    resources: tuple[Resource, ...]
    version: int = VERSION
    checksum_algorithm: str = CHECKSUM_ALGORITHM

    def to_json(self) -> bytes:
        d = {
            "format": "ninfer", "version": self.version, "checksum_algorithm": self.checksum_algorithm,
            "config": dict(self.config), "metadata": dict(self.metadata), "provenance": dict(self.provenance),
            "objects": [_object_dict(o) for o in self.objects],
            "bindings": [_binding_dict(b) for b in self.bindings],
            "uses": [{"site": u.site, "binding": u.binding, "feature": u.feature, "activation": u.activation}
                     for u in self.uses],
            "resources": [{"name": r.name, "object": r.object, "media_type": r.media_type} for r in self.resources],
        }
        return json.dumps(d, indent=1, sort_keys=False).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes) -> "Descriptor":
        try:
            d = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ArtifactError("descriptor", "invalid JSON", str(e)) from None
        except RecursionError:  # nested past the JSON parser's own limit
            d = _TOO_DEEP
        if d is _TOO_DEEP or _too_deep(d):
            raise ArtifactError("descriptor", "nested too deeply",
                                f"arrays and objects more than {MAX_DESCRIPTOR_DEPTH} levels deep") from None
        return parse(d)


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_DESCRIPTOR_DEPTH:
                return True
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def _object_dict(o: Object) -> dict:
    return {"name": o.name, "offset": o.offset, "nbytes": o.nbytes, "format": o.format, "dtype": o.dtype,
            "shape": list(o.shape), "params": dict(o.params), "checksum": o.checksum,
            "planes": [{"name": p.name, "offset": p.offset, "nbytes": p.nbytes, "dtype": p.dtype,
                        "shape": list(p.shape), "rows_per_entry": p.rows_per_entry} for p in o.planes]}


def _binding_dict(b: Binding) -> dict:
    return {"name": b.name, "object": b.object, "feature": b.feature, "kind": b.kind, "shape": list(b.shape),
            "rows": list(b.rows) if b.rows is not None else None, "planes": list(b.planes)}


def _get(d: Any, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, dict):
        raise ArtifactError(where, "not a JSON object")
    if key not in d:
        raise ArtifactError(f"{where}.{key}", "missing field")
    v = d[key]
    # bool is an int in Python; a count or offset written as true/false is still malformed.
    if not isinstance(v, typ) or (isinstance(v, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,))):
        raise ArtifactError(f"{where}.{key}", "wrong type", f"expected {typ}, got {type(v).__name__}")
    return v


def _uint(d: Any, key: str, where: str) -> int:
    v = _get(d, key, int, where)
    if v < 0:
        raise ArtifactError(f"{where}.{key}", "negative value", str(v))
    return v


def _shape(d: Any, key: str, where: str) -> tuple[int, ...]:
    v = _get(d, key, list, where)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in v):
        raise ArtifactError(f"{where}.{key}", "shape must be a list of non-negative ints", repr(v))
    return tuple(v)


def _plane(d: Any, where: str) -> Plane:
    return Plane(_get(d, "name", str, where), _uint(d, "offset", where), _uint(d, "nbytes", where),
                 _get(d, "dtype", str, where), _shape(d, "shape", where), _uint(d, "rows_per_entry", where))


def _object(d: Any, where: str) -> Object:
    planes = tuple(_plane(p, f"{where}.planes[{i}]") for i, p in enumerate(_get(d, "planes", list, where)))
    return Object(_get(d, "name", str, where), _uint(d, "offset", where), _uint(d, "nbytes", where),
                  _get(d, "format", str, where), _get(d, "dtype", str, where), _shape(d, "shape", where),
                  _get(d, "params", dict, where), planes, _uint(d, "checksum", where))


def _binding(d: Any, where: str) -> Binding:
    rows = _get(d, "rows", (list, type(None)), where)
    if rows is not None and (len(rows) != 2 or not all(isinstance(r, int) and r >= 0 for r in rows)):
        raise ArtifactError(f"{where}.rows", "must be null or [start, stop]", repr(rows))
    planes = _get(d, "planes", list, where)
    if not all(isinstance(p, str) for p in planes):
        raise ArtifactError(f"{where}.planes", "must be a list of plane names", repr(planes))
    return Binding(_get(d, "name", str, where), _get(d, "object", str, where), _get(d, "feature", str, where),
                   _get(d, "kind", str, where), _shape(d, "shape", where),
                   tuple(rows) if rows is not None else None, tuple(planes))


def _use(d: Any, where: str) -> Use:
    u = Use(_get(d, "site", str, where), _get(d, "binding", str, where), _get(d, "feature", str, where),
            _get(d, "activation", str, where))
    if u.activation not in ACTIVATIONS:
        raise ArtifactError(f"{where}.activation", "unknown activation permission",
                            f"{u.activation!r} not in {sorted(ACTIVATIONS)}")
    return u


def _resource(d: Any, where: str) -> Resource:
    return Resource(_get(d, "name", str, where), _get(d, "object", str, where), _get(d, "media_type", str, where))


def _entries(d: dict, key: str, parse_one: Callable[[Any, str], Any]) -> tuple:
    items = _get(d, key, list, "descriptor")
    return tuple(parse_one(x, f"descriptor.{key}[{i}]") for i, x in enumerate(items))


def parse(d: Any) -> Descriptor:
    """Type-check a decoded descriptor and build the dataclasses."""
    if _get(d, "format", str, "descriptor") != "ninfer":
        raise ArtifactError("descriptor.format", "not a ninfer descriptor", repr(d["format"]))
    version = _get(d, "version", int, "descriptor")
    if version != VERSION:
        raise ArtifactError("descriptor.version", "unsupported version", f"{version}, reader supports {VERSION}")
    algo = _get(d, "checksum_algorithm", str, "descriptor")
    if algo != CHECKSUM_ALGORITHM:
        raise ArtifactError("descriptor.checksum_algorithm", "unsupported", repr(algo))
    return Descriptor(
        config=_get(d, "config", dict, "descriptor"), metadata=_get(d, "metadata", dict, "descriptor"),
        provenance=_get(d, "provenance", dict, "descriptor"),
        objects=_entries(d, "objects", _object), bindings=_entries(d, "bindings", _binding),
        uses=_entries(d, "uses", _use), resources=_entries(d, "resources", _resource), version=version,
        checksum_algorithm=algo)


def intersect_activations(permissions: list[str]) -> str:
    """The permission of a fused call: the intersection of its Uses' permissions (always one of the named three)."""
    if not permissions:
        raise ValueError("a fused call needs at least one Use")
    allowed = frozenset.intersection(*(ACTIVATIONS[p] for p in permissions))
    return next(name for name, s in ACTIVATIONS.items() if s == allowed)
