"""Token sampling as a pure function of (logits, parameters, seed, position, token history).

``sample_row`` is the definition for one row; ``sample`` applies it to a batch, sharing the
filter and RNG kernels across rows and skipping the RNG entirely for an all-greedy batch. A
random row draws by exponential race in log form, token = argmax_t(z_t + g_t) with Gumbel noise
g_t = -log(E_t), E_t = -log(u_t): the same argmax as p_t / E_t (docs/sampling.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ninfer.contracts import RowFailure
from ninfer.sampling.filters import apply_temperature, truncate
from ninfer.sampling.params import SEED_END, SamplingParams
from ninfer.sampling.philox import gumbel_noise, seed_tensor
from ninfer.sampling.processors import SamplingError, adjust_logits

# Positions travel as int64 tensors into the RNG.
POSITION_END = 1 << 63


@dataclass(frozen=True, eq=False)
class RowSampling:
    """Everything one row's draw depends on besides its logits.

    ``position`` is the absolute index of the token being drawn in its sequence (prompt length
    plus tokens already produced, drafts included), so a replay or rollback to a position redraws
    the same token. ``allowed`` is an optional grammar gate: bool [V] or an int32 xgrammar
    bitmask [ceil(V / 32)].
    """

    params: SamplingParams
    seed: int
    position: int
    prompt_token_ids: Sequence[int] | torch.Tensor = ()
    output_token_ids: Sequence[int] | torch.Tensor = ()
    eos_token_ids: tuple[int, ...] = ()
    allowed: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(self.params).__name__}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < SEED_END:
            raise ValueError(f"seed must be a resolved int in [0, 2^64), got {self.seed!r}")
        if isinstance(self.position, bool) or not isinstance(self.position, int) \
                or not 0 <= self.position < POSITION_END:
            raise ValueError(f"position must be an int in [0, 2^63), got {self.position!r}")


def _adjust(logits: torch.Tensor, row: RowSampling) -> torch.Tensor:
    return adjust_logits(logits, row.params, prompt_token_ids=row.prompt_token_ids,
                         output_token_ids=row.output_token_ids,
                         eos_token_ids=row.eos_token_ids, allowed=row.allowed)


def _check_drawable(x: torch.Tensor) -> None:
    """Refuse rows the race would answer with garbage: NaN/+inf logits, or nothing left."""
    bad = torch.isnan(x).any(dim=-1) | torch.isposinf(x).any(dim=-1)  # [B]
    if bool(bad.any()):
        raise SamplingError(f"logits row {int(bad.nonzero()[0])} contains NaN or +inf", RowFailure.NON_FINITE_LOGITS)
    empty = torch.isneginf(x).all(dim=-1)  # [B]
    if bool(empty.any()):
        raise SamplingError(f"row {int(empty.nonzero()[0])}: every token is masked "
                            "(logit_bias, allowed-token mask and min_tokens leave nothing)", RowFailure.NOTHING_ALLOWED)


def _truncated(x: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    """Steps 5-8 for random rows: x [B, V] -> z [B, V] with dropped tokens at -inf."""
    def column(values: list[float | int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=x.device)  # [B]

    z = apply_temperature(x, column([r.params.temperature for r in rows], torch.float64))
    return truncate(z, column([r.params.effective_top_k for r in rows], torch.int64),
                    column([r.params.top_p for r in rows], torch.float64),
                    column([r.params.min_p for r in rows], torch.float64))


def _race(z: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    """argmax_t(z_t + g_t) per row, in float64, lowest id on ties. z [B, V] -> [B] int64."""
    seeds = seed_tensor([r.seed for r in rows], device=z.device)  # [B]
    positions = torch.tensor([r.position for r in rows], dtype=torch.int64, device=z.device)
    noise = gumbel_noise(seeds, positions, z.shape[-1])  # [B, V] float32
    return torch.argmax(z.to(torch.float64) + noise.to(torch.float64), dim=-1)


def processed_logits(logits: torch.Tensor, row: RowSampling) -> torch.Tensor:
    """The row's logits after steps 1-8: what the race runs on, -inf where dropped. [V] float32.

    Greedy rows stop after step 4 (temperature and truncation cannot move an argmax).
    """
    x = _adjust(logits, row)  # [V]
    _check_drawable(x.unsqueeze(0))
    if row.params.is_greedy:
        return x
    return _truncated(x.unsqueeze(0), [row])[0]


def sample_row(logits: torch.Tensor, row: RowSampling) -> int:
    """Draw one token from one logits row [V]: the definition ``sample`` must match."""
    z = processed_logits(logits, row)  # [V]
    if row.params.is_greedy:
        # torch.argmax returns the first maximum: ties go to the lowest id
        return int(torch.argmax(z))
    return int(_race(z.unsqueeze(0), [row])[0])


def sample(logits: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    """Draw one token per row. logits [B, V] (any float dtype, read as float32) -> int64 [B]."""
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise SamplingError(f"logits must be [B, V] with B = len(rows) = {len(rows)}, "
                            f"got {tuple(logits.shape)}")
    x = torch.stack([_adjust(logits[b], row) for b, row in enumerate(rows)])  # [B, V]
    _check_drawable(x)
    tokens = torch.argmax(x, dim=-1)  # [B]; final for greedy rows
    random_rows = [b for b, row in enumerate(rows) if not row.params.is_greedy]
    if not random_rows:
        return tokens
    picked = [rows[b] for b in random_rows]
    index = torch.tensor(random_rows, dtype=torch.int64, device=x.device)
    tokens[index] = _race(_truncated(x[index], picked), picked)
    return tokens
