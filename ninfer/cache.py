"""The ninfer cache directory and atomic publication of files into it.

Several processes (test workers, a CLI and a server) may build the same cached file at the same time. Every
writer builds into a private temporary name in the destination directory and publishes it with one
``os.replace``, so a reader sees either no file or a complete one, and concurrent builders both end with a
valid file (the last rename wins; the contents are identical).
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from platformdirs import user_cache_dir

CACHE_ENV = "NINFER_CACHE_DIR"


def cache_dir() -> Path:
    """The ninfer cache root: ``$NINFER_CACHE_DIR`` if set, else the platform's user cache dir.

    The directory is created on first use.
    """
    override = os.environ.get(CACHE_ENV)
    root = Path(override) if override else Path(user_cache_dir("ninfer"))
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; on success rename it onto ``dest``, on failure remove it.

    The temporary name lives in the same directory so the rename never crosses a file system.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # mkstemp creates 0600; published cache files get the usual 0644 (reading the umask would briefly
        # change it for every thread of the process).
        if tmp.exists():
            tmp.chmod(0o644)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_bytes(dest: Path, data: bytes) -> None:
    """Write ``data`` to ``dest`` so that no reader ever sees a partial file."""
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)
