"""Convert an HF checkpoint directory once and reuse the artifact from the cache afterwards.

The cache key covers the config and the identity (name, size, mtime) of every weight and Frontend file, so an
edited checkpoint is converted again while an unchanged one costs a few stat calls. It also covers the converter's
own code (the digest of the packages that decide what an artifact holds), so an upgraded ninfer converts again
instead of serving an artifact an older converter wrote.
"""

from __future__ import annotations

import hashlib
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable

from ninfer.cache import cache_dir

_KEYED_SUFFIXES = (".safetensors", ".json", ".jinja", ".tiktoken", ".txt")
# what decides an artifact's bytes: the converter, the container and its formats, the model's parameter table
_CONVERTER_PACKAGES = ("convert", "artifact", "models")


@lru_cache(maxsize=1)
def converter_digest() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for package in _CONVERTER_PACKAGES:
        for f in sorted((root / package).rglob("*.py")):
            h.update(f"{f.relative_to(root)}\0".encode() + f.read_bytes())
    return h.hexdigest()


def checkpoint_key(src_dir: Path) -> str:
    h = hashlib.sha256(converter_digest().encode())
    for f in sorted(p for p in src_dir.iterdir() if p.is_file() and p.suffix in _KEYED_SUFFIXES):
        st = f.stat()
        h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def converted_path(src_dir: Path, *, progress: bool = True, report: Callable[[str], None] | None = None) -> Path:
    """The cached artifact of `src_dir`, converting it first when the cache has none for this content; a
    conversion is reported once through ``report`` (a cache hit costs a few stat calls and says nothing)."""
    from ninfer.convert.convert import convert_checkpoint

    src_dir = src_dir.resolve()
    out = cache_dir() / "converted" / f"{src_dir.name}-{checkpoint_key(src_dir)}.ninfer"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        convert_checkpoint(src_dir, out, progress=progress)
        if report is not None:
            report(f"converted {src_dir} into the cache, {time.monotonic() - start:.1f} s ({out})")
    return out
