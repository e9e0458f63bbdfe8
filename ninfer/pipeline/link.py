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

    def pass_into(self, x: torch.Tensor, out: torch.Tensor, src: int, dst: int) -> torch.Tensor:
        """The same into `out`, a tensor of `x`'s shape on rank `dst`'s device (a CUDA graph's static input)."""
        ...


class PeerLink:
    """Stages of one process: `devices[rank]` is each rank's torch device; counts what crossed (tests, bench)."""

    def __init__(self, devices: tuple[str, ...]):
        self.devices = tuple(torch.device(d) for d in devices)
        self.passes = 0
        self.bytes = 0

    def pass_on(self, x: torch.Tensor, src: int, dst: int) -> torch.Tensor:
        self._count(x, src)
        # same device (`--devices 0,0`, `cpu,cpu`): a copy still, so no stage aliases another's activations
        return x.to(self.devices[dst], copy=True, non_blocking=True)

    def pass_into(self, x: torch.Tensor, out: torch.Tensor, src: int, dst: int) -> torch.Tensor:
        self._count(x, src)
        if out.device != self.devices[dst] or out.shape != x.shape:
            raise RuntimeError(f"stage link: {tuple(x.shape)} into {tuple(out.shape)} on {out.device}, not rank "
                               f"{dst}'s ({self.devices[dst]})")
        return out.copy_(x, non_blocking=True)

    def _count(self, x: torch.Tensor, src: int) -> None:
        if x.device != self.devices[src]:
            raise RuntimeError(f"stage link: a tensor on {x.device} passed as rank {src}'s ({self.devices[src]})")
        self.passes += 1
        self.bytes += x.numel() * x.element_size()
