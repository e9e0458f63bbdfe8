"""The gumbel_race op's definition in plain torch: one categorical draw per row from processed logits z, as the
host draws it (docs/sampling.md section 4): the winner of z + Gumbel noise of (seed, position, stream), the sum in
float64, the lowest id on ties. The noise is the host's own vectorised Philox (``ninfer.sampling.philox``)."""

from __future__ import annotations

import torch

from ninfer.sampling.philox import gumbel_noise


def gumbel_race_naive(z: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """z [B, V] float32 (-inf where dropped), seeds / positions [B] int64 -> tokens [B] int64."""
    noise = gumbel_noise(seeds, positions, z.shape[-1], stream)  # [B, V] float32
    return torch.argmax(z.double() + noise.double(), dim=-1)
