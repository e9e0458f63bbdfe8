"""The fast vision tower's planned workspace: one device buffer sized at start for the largest image the
processor can produce, carved into regions whose lifetimes are disjoint within one encode, so an encode takes its
activations from the plan instead of the caching allocator.

Regions (N patches, H hidden, I MLP width, P the flattened patch, ``act`` the tower's element size):
  x    [N, H]   the residual stream
  y    [N, H]   a norm's output (the blocks' and the merger's), the resampled position embedding at the start
  qkv  [N, 3H]  the qkv projection, rotated in place; at the start the host's fp32 pixels [N, P]
  o    [N, H]   the attention output, a position-table tap at the start, the merger's hidden [N/4, 4H]
  mlp  [N, I]   the MLP hidden; at the start the pixels in the tower's dtype [N, P]
What stays outside: the features an encode returns (held by the Program's image inputs, budgeted there), the
output of a torch SDPA backend when the tower measured one the fastest (none writes into a given buffer) and the
per-grid index tables (a bounded cache). ``FastVisionTower.workspace_bytes`` counts all of them.
"""

from __future__ import annotations

import torch

from ninfer.models.qwen3_5.vision_config import VisionConfig

_ALIGN = 256  # bytes: every region starts where cuBLAS and the kernels' vector loads want it


def region_bytes(v: VisionConfig, patches: int, dtype: torch.dtype) -> dict[str, int]:
    act, N, H = torch.finfo(dtype).bits // 8, patches, v.hidden_size
    return {"x": N * H * act, "y": N * H * act, "qkv": max(N * 3 * H * act, N * v.patch_dim * 4),
            "o": N * H * act, "mlp": max(N * v.intermediate_size * act, N * v.patch_dim * act)}


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class VisionWorkspace:
    def __init__(self, v: VisionConfig, patches: int, dtype: torch.dtype, device: torch.device):
        self.patches, self.dtype = patches, dtype
        sizes = region_bytes(v, patches, dtype)
        self._at: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, n in sizes.items():
            self._at[name] = (offset, n)
            offset += _aligned(n)
        self.buffer = torch.empty(offset, dtype=torch.uint8, device=device)

    @staticmethod
    def nbytes(v: VisionConfig, patches: int, dtype: torch.dtype) -> int:
        return sum(_aligned(n) for n in region_bytes(v, patches, dtype).values())

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        """A contiguous view of region ``name`` as ``shape`` (the tower's dtype unless given)."""
        dtype = self.dtype if dtype is None else dtype
        offset, n = self._at[name]
        numel = 1
        for s in shape:
            numel *= s
        size = numel * (torch.finfo(dtype).bits // 8)
        if size > n:
            raise ValueError(f"vision workspace: {shape} {dtype} does not fit region {name!r} ({n} bytes)")
        return self.buffer[offset:offset + size].view(dtype).view(shape)
