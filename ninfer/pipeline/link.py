"""StageLink: how the residual passes from one pipeline stage to the next and back to rank 0.

A Program calls `pass_on(x, src, dst)` at every stage boundary of a forward pass (rank r -> r + 1) and once from
the last stage back to rank 0 (the final norm, the head and sampling run there): one hidden-state tensor [T, H]
per boundary, nothing else crosses. `PeerLink` is the one-process form: stages are devices of one host and the
copy is torch's peer-to-peer device copy (it orders itself after the source's stream and before the
destination's). The interface takes ranks, not devices, so stages in separate processes can implement it later
over `torch.distributed` send/recv (NCCL) without a Program noticing; NVLink multicast is never used.
"""

from __future__ import annotations

from typing import Protocol

import torch


class StageLink(Protocol):
    def pass_on(self, x: torch.Tensor, src: int, dst: int) -> torch.Tensor:
        """`x` (on rank `src`'s device) as a tensor on rank `dst`'s device."""
        ...


class PeerLink:
    """Stages of one process: `devices[rank]` is each rank's torch device; counts what crossed (tests, bench)."""

    def __init__(self, devices: tuple[str, ...]):
        self.devices = tuple(torch.device(d) for d in devices)
        self.passes = 0
        self.bytes = 0

    def pass_on(self, x: torch.Tensor, src: int, dst: int) -> torch.Tensor:
        if x.device != self.devices[src]:
            raise RuntimeError(f"stage link: a tensor on {x.device} passed as rank {src}'s ({self.devices[src]})")
        self.passes += 1
        self.bytes += x.numel() * x.element_size()
        # same device (`--devices 0,0`, `cpu,cpu`): a copy still, so no stage aliases another's activations
        return x.to(self.devices[dst], copy=True, non_blocking=True)
