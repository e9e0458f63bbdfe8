"""The fast Program's host <-> device crossings outside the CUDA graphs, in one place.

``to_device`` queues a host list as a device tensor through pinned memory without waiting: a tensor built from a
list straight on CUDA is a pageable copy, which first waits for the stream (a host sync in the middle of a step).
``host_sync`` is the wait for the stream before host code reads a buffer the device filled: a round's one sync,
counted by ``ninfer.testing.host_syncs``. ``HostMirror`` is a graph's int32 input buffer with a pinned host twin,
filled in place and sent in one copy.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def to_device(values: Sequence, device: torch.device, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """[len(values)] (or the nested list's shape) on `device`, queued without a host wait on CUDA."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def host_sync(device: torch.device) -> None:
    """Wait until the device's current stream has finished (its copies into pinned host buffers included)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class HostMirror:
    """A device int32 buffer [size] (`device`, what graphs read) and its pinned host twin (`host`, numpy): `open`
    waits until the last copy has left the twin and returns it to fill; `send` queues its copy to the device
    without a host wait. One copy a call however many fields the buffer packs."""

    def __init__(self, size: int, device: torch.device):
        self.device = torch.zeros(size, dtype=torch.int32, device=device)
        pin = device.type == "cuda" and torch.cuda.is_available()
        self._staging = torch.zeros(size, dtype=torch.int32, pin_memory=pin)
        self.host = self._staging.numpy()
        self._copied = torch.cuda.Event() if pin else None  # the twin's last copy; refilling waits for it

    def open(self) -> np.ndarray:
        if self._copied is not None:
            self._copied.synchronize()
        return self.host

    def send(self, upto: int | None = None) -> None:
        """Queue the copy of the twin's first `upto` entries (all by default)."""
        self.device[:upto].copy_(self._staging[:upto], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
