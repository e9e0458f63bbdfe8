"""Structural checks of a descriptor against its header: bounds, alignment, overlap, geometry, cross-references.

Shared by the reader (on open) and the writer (before the atomic rename), so a file the writer produces always
passes the reader's checks. Checksums are not read here.
"""

from __future__ import annotations

from .descriptor import Binding, Descriptor, Object
from .errors import ArtifactError
from .formats import get_format, layout
from .header import Header

FEATURES = ("text", "mtp", "vision", "dflash", "dflash2")


def _unique(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ArtifactError(f"{what} {n!r}", "duplicate name")
        seen.add(n)


def check_object(o: Object, header: Header) -> None:
    subject = f"object {o.name!r}"
    if o.offset % header.alignment or o.offset < header.data_offset:
        raise ArtifactError(subject, "misaligned offset", f"offset {o.offset}, alignment {header.alignment}")
    if o.offset + o.nbytes > header.descriptor_offset:
        raise ArtifactError(subject, "object outside the data region",
                            f"[{o.offset}, {o.offset + o.nbytes}) runs past {header.descriptor_offset}")
    try:
        specs = get_format(o.format).planes(o.shape, o.dtype, o.params)
    except ValueError as e:
        raise ArtifactError(subject, "format/dtype/shape inconsistent", str(e)) from None
    offsets, total = layout(specs)
    if total != o.nbytes:
        raise ArtifactError(subject, "nbytes does not match dtype and shape",
                            f"{o.format}/{o.dtype} {list(o.shape)} needs {total} bytes, descriptor says {o.nbytes}")
    expected = [(s.name, off, s.nbytes, s.dtype, tuple(s.shape), s.rows_per_entry) for s, off in zip(specs, offsets)]
    actual = [(p.name, p.offset, p.nbytes, p.dtype, p.shape, p.rows_per_entry) for p in o.planes]
    if expected != actual:
        raise ArtifactError(subject, "planes do not match the format", f"expected {expected}, got {actual}")


def check_view(b: Binding, o: Object) -> None:
    subject = f"binding {b.name!r}"
    unknown = [p for p in b.planes if p not in {q.name for q in o.planes}]
    if unknown:
        raise ArtifactError(subject, "uses planes the object lacks", f"{unknown} of object {o.name!r}")
    if b.rows is None:
        if b.shape != o.shape:
            raise ArtifactError(subject, "geometry differs from its object",
                                f"{list(b.shape)} vs object {o.name!r} {list(o.shape)}")
        return
    start, stop = b.rows
    if not o.shape or not 0 <= start < stop <= o.shape[0]:
        raise ArtifactError(subject, "view rows out of range", f"[{start}, {stop}) of object {o.name!r} {list(o.shape)}")
    if b.shape != (stop - start, *o.shape[1:]):
        raise ArtifactError(subject, "view geometry does not match its row range",
                            f"{list(b.shape)} vs rows [{start}, {stop}) of {list(o.shape)}")
    for p in o.planes:
        rpe = p.rows_per_entry
        if rpe and (start % rpe or (stop % rpe and stop != o.shape[0])):
            raise ArtifactError(subject, "view rows not aligned to a plane",
                                f"plane {p.name!r} of object {o.name!r} groups {rpe} rows; view [{start}, {stop})")


def check_descriptor(desc: Descriptor, header: Header) -> None:
    """Raise ArtifactError at the first inconsistency; the message names the entry and the check."""
    _unique([o.name for o in desc.objects], "object")
    _unique([b.name for b in desc.bindings], "binding")
    _unique([r.name for r in desc.resources], "resource")
    objects = {o.name: o for o in desc.objects}
    for o in desc.objects:
        check_object(o, header)
    ordered = sorted(desc.objects, key=lambda o: o.offset)
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.nbytes > b.offset:
            raise ArtifactError(f"object {b.name!r}", "overlaps another object", f"{a.name!r} ends at {a.offset + a.nbytes}")
    for b in desc.bindings:
        if b.object not in objects:
            raise ArtifactError(f"binding {b.name!r}", "references a missing object", repr(b.object))
        if b.feature not in FEATURES:
            raise ArtifactError(f"binding {b.name!r}", "unknown feature", f"{b.feature!r} not in {FEATURES}")
        check_view(b, objects[b.object])
    bindings = {b.name for b in desc.bindings}
    for u in desc.uses:
        if u.binding not in bindings:
            raise ArtifactError(f"use {u.site!r}", "references a missing binding", repr(u.binding))
    for r in desc.resources:
        if r.object not in objects:
            raise ArtifactError(f"resource {r.name!r}", "references a missing object", repr(r.object))
