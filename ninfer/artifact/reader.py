"""Memory-mapped ``.ninfer`` reader: validate on open, verify each object's checksum the first time it is read.

Tensors are zero-copy views of a private (copy-on-write) mapping of the file: reading costs page faults, not copies,
and a consumer that writes into a tensor changes only its own process's pages, never the file. Treat them as
read-only. Every tensor and array handed out holds the mapping open, so they stay valid after :meth:`close`.
"""

from __future__ import annotations

import mmap
import os
import zlib
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from ninfer.models.qwen3_5.params import TEXT
from ninfer.models.qwen3_5.drafter import RESOURCE as DRAFTER_RESOURCE

from .binder import DRAFTER_FEATURES, check_bindings, check_drafter_bindings, parse_config, parse_drafter
from .descriptor import Binding, Descriptor, Object, Resource, Use
from .errors import ArtifactError
from .formats import NUMPY_DTYPES, TORCH_DTYPES, get_format
from .header import HEADER_SIZE, Header
from .validate import FEATURES, check_descriptor

_CRC_CHUNK = 64 << 20


class Artifact:
    """An open artifact restricted to the selected features. Use :func:`open_artifact` to create one."""

    def __init__(self, path: str | Path, features: Iterable[str] | None = (TEXT,)):
        self.path = Path(path)
        # None selects every feature the artifact binds (inspection, verification).
        self.features = tuple(features) if features is not None else (TEXT,)
        self._all_features = features is None
        if TEXT not in self.features:
            raise ArtifactError("features", "text is required", f"selected {self.features}")
        unknown = [f for f in self.features if f not in FEATURES]
        if unknown:
            raise ArtifactError("features", "unknown feature", f"{unknown} not in {FEATURES}")
        try:
            self._file = open(self.path, "rb")
        except OSError as e:
            raise ArtifactError(f"file {str(self.path)!r}", "cannot open", str(e)) from None
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        size = os.fstat(self._file.fileno()).st_size
        self.header = Header.unpack(self._file.read(HEADER_SIZE), size)
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY)
        h = self.header
        raw = self._mm[h.descriptor_offset: h.descriptor_offset + h.descriptor_length]
        if zlib.crc32(raw) & 0xFFFFFFFF != h.descriptor_crc32:
            raise ArtifactError("descriptor", "checksum mismatch", "the descriptor bytes were modified or truncated")
        self.descriptor = Descriptor.from_json(raw)
        check_descriptor(self.descriptor, h)
        self.config = parse_config(self.descriptor.config)
        self.objects: dict[str, Object] = {o.name: o for o in self.descriptor.objects}
        self.available_features = tuple(sorted({b.feature for b in self.descriptor.bindings}))
        if self._all_features:
            self.features = tuple(sorted({TEXT, *self.available_features}))
        absent = [f for f in self.features if f not in self.available_features]
        if absent:
            raise ArtifactError(f"feature {absent[0]!r}", "not available",
                                f"the artifact binds only {list(self.available_features)}")
        self.bindings: dict[str, Binding] = {b.name: b for b in self.descriptor.bindings if b.feature in self.features}
        self.uses: tuple[Use, ...] = tuple(u for u in self.descriptor.uses if u.feature in self.features)
        self.resources: dict[str, Resource] = {r.name: r for r in self.descriptor.resources}
        check_bindings(self.config, self.bindings, self.features)
        self._verified: set[str] = set()
        self.drafter = None  # the drafter's config when a drafter feature is selected (DrafterConfig)
        if any(f in DRAFTER_FEATURES for f in self.features):
            self.drafter = parse_drafter(self.resource(DRAFTER_RESOURCE), self.config)
            check_drafter_bindings(self.drafter, self.bindings)

    def close(self) -> None:
        mm = getattr(self, "_mm", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # Tensors handed out still view the mapping; it is unmapped when the last of them dies.
                pass
        self._file.close()

    def __enter__(self) -> "Artifact":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def metadata(self) -> dict:
        return dict(self.descriptor.metadata)

    @property
    def provenance(self) -> dict:
        return dict(self.descriptor.provenance)

    def _check(self, o: Object) -> None:
        if o.name in self._verified:
            return
        crc = 0
        view = memoryview(self._mm)
        try:
            for start in range(o.offset, o.offset + o.nbytes, _CRC_CHUNK):
                crc = zlib.crc32(view[start: min(start + _CRC_CHUNK, o.offset + o.nbytes)], crc)
        finally:
            view.release()
        if crc & 0xFFFFFFFF != o.checksum:
            raise ArtifactError(f"object {o.name!r}", "checksum mismatch",
                                f"crc32 {crc & 0xFFFFFFFF:#010x}, descriptor says {o.checksum:#010x}")
        self._verified.add(o.name)

    def verify(self, objects: Iterable[str] | None = None) -> int:
        """Check the checksum of every object (or the named ones); raise at the first broken one. Returns bytes read."""
        total = 0
        for name in objects if objects is not None else self.objects:
            o = self.objects[name]
            self._check(o)
            total += o.nbytes
        return total

    def _binding(self, name: str) -> Binding:
        if name not in self.bindings:
            raise ArtifactError(f"binding {name!r}", "not bound for the selected features", f"features {self.features}")
        return self.bindings[name]

    def object_planes(self, name: str) -> dict[str, np.ndarray]:
        """Every plane of an object as a typed numpy view (bf16/fp8 planes as unsigned bits), checksum verified."""
        o = self.objects[name]
        self._check(o)
        out = {}
        for p in o.planes:
            n = p.nbytes // np.dtype(NUMPY_DTYPES[p.dtype]).itemsize
            arr = np.frombuffer(self._mm, dtype=NUMPY_DTYPES[p.dtype], count=n, offset=o.offset + p.offset)
            out[p.name] = arr.reshape(p.shape)
        return out

    def planes(self, name: str) -> dict[str, np.ndarray]:
        """The planes a binding uses, with its row view applied (planes with rows_per_entry=0 are kept whole)."""
        b = self._binding(name)
        o = self.objects[b.object]
        full = self.object_planes(b.object)
        wanted = b.planes or tuple(p.name for p in o.planes)
        out = {}
        for p in o.planes:
            if p.name not in wanted:
                continue
            arr = full[p.name]
            if b.rows is not None and p.rows_per_entry:
                r = p.rows_per_entry
                arr = arr[b.rows[0] // r: -(-b.rows[1] // r)]
            out[p.name] = arr
        return out

    def tensor(self, name: str) -> torch.Tensor:
        """A dense binding as a zero-copy torch tensor in its stored dtype (row views are slices of the parent)."""
        b = self._binding(name)
        o = self.objects[b.object]
        if o.format != "dense":
            raise ArtifactError(f"binding {name!r}", "not dense", f"object {o.name!r} is {o.format}; use dequantize()")
        data = self.object_planes(o.name)["data"]
        # from_numpy keeps the numpy view, and through it the mapping, alive as long as the tensor lives;
        # torch.frombuffer would not, and a close() would then leave the tensor pointing at unmapped memory.
        t = torch.from_numpy(data).view(TORCH_DTYPES[o.planes[0].dtype])
        return t if b.rows is None else t[b.rows[0]: b.rows[1]]

    def dequantize(self, name: str) -> torch.Tensor:
        """Any binding's values as an fp32 tensor (a copy), through its format's unpack."""
        b = self._binding(name)
        o = self.objects[b.object]
        fmt = get_format(o.format)
        return torch.from_numpy(fmt.unpack(self.planes(name), b.shape, o.dtype, o.params))

    def resource(self, name: str) -> bytes:
        if name not in self.resources:
            raise ArtifactError(f"resource {name!r}", "not in the artifact", f"has {sorted(self.resources)}")
        return self.object_planes(self.resources[name].object)["data"].tobytes()

    def uses_of(self, binding: str) -> list[Use]:
        return [u for u in self.uses if u.binding == binding]


def open_artifact(path: str | Path, features: Iterable[str] | None = (TEXT,)) -> Artifact:
    """Open and validate a ``.ninfer`` file for the given features (``"text"`` required; ``"mtp"``, ``"vision"``,
    ``"dflash"``, ``"dflash2"``; ``None``: every feature the file binds)."""
    return Artifact(path, features)
