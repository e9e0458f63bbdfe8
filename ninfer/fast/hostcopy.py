"""The fast Program's host <-> device crossings outside the CUDA graphs, in one place.

``to_device`` queues a host list as a device tensor through pinned memory without waiting: a tensor built from a
list straight on CUDA is a pageable copy, which first waits for the stream (a host sync in the middle of a step).
``host_sync`` is the wait for the stream before host code reads a buffer the device filled: a round's one sync,
counted by ``ninfer.testing.host_syncs``.
"""

from __future__ import annotations

from typing import Sequence

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
