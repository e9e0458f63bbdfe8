"""Count the host syncs a piece of the fast Program makes, on any device (a CPU test counts what would stall a GPU).

Inside ``count_host_syncs()`` every call that reads a tensor's value on the host (``item``, ``tolist``, ``cpu``,
``bool``/``int``/``float``/``index`` of a tensor), every tensor built from host data straight onto a
device (``torch.tensor(..., device=...)``: on CUDA a pageable copy, which waits for the stream) and every
``ninfer.fast.hostcopy.host_sync`` is recorded with its call site, when the caller is the fast Program's own code
(``ninfer/fast``, ``ninfer/program_core``) and not an op's ``naive.py`` (which stands in for a kernel). Tensor reads
of host tensors count too (on a CPU test every tensor is one): the Program's host code reads the buffers a device
filled through numpy views, after the one ``host_sync``.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

import ninfer.fast.hostcopy as hostcopy

_ROOT = Path(__file__).resolve().parents[1]  # the ninfer package
_WATCHED = (_ROOT / "fast", _ROOT / "program_core")
# numpy() is not among them: it refuses a device tensor, so it is never a sync (host buffers are read through it)
_READS = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__")


@dataclass
class HostSyncs:
    sites: list[str] = field(default_factory=list)  # "file:line what" of every counted call

    @property
    def count(self) -> int:
        return len(self.sites)


def _site(depth: int) -> str | None:
    """The caller's "file:line" when it is watched code, else None."""
    frame = sys._getframe(depth)
    path = Path(frame.f_code.co_filename).resolve()
    if path.name == "naive.py" or not any(root in path.parents for root in _WATCHED):
        return None
    return f"{path.relative_to(_ROOT.parent)}:{frame.f_lineno}"


@contextlib.contextmanager
def count_host_syncs():
    seen = HostSyncs()

    def watch(name: str, original, device_arg: bool = False):
        def wrapper(*args, **kwargs):
            if not device_arg or kwargs.get("device") is not None:
                site = _site(2)
                if site is not None:
                    seen.sites.append(f"{site} {name}")
            return original(*args, **kwargs)
        return wrapper

    saved = {name: getattr(torch.Tensor, name) for name in _READS}
    saved_tensor, saved_sync = torch.tensor, hostcopy.host_sync
    try:
        for name, original in saved.items():
            setattr(torch.Tensor, name, watch(name, original))
        torch.tensor = watch("torch.tensor(device=)", saved_tensor, device_arg=True)
        hostcopy.host_sync = watch("host_sync", saved_sync)
        yield seen
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)
        torch.tensor, hostcopy.host_sync = saved_tensor, saved_sync
