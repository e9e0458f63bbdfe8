"""Counter-based random numbers for sampling: Philox-4x32-10 keyed by (seed, position).

Stateless by design: the uniform for vocabulary index ``i`` of a draw is a pure function of
(seed, position, stream, i), so replays are exact and rolling the RNG back is rolling the
position back. Only 32-bit integer multiply (low and high halves), add, xor and shifts are used,
so a Triton kernel reproduces it bit for bit; docs/sampling.md is the port's specification.

Two implementations that must agree exactly: a pure-Python scalar oracle and a vectorised torch
version. Torch has no general uint32 arithmetic, so the torch version keeps each 32-bit word in
an int64 tensor in [0, 2^32) and splits every multiply into 16-bit halves so that no intermediate
leaves [0, 2^63) (signed overflow would be undefined behaviour in the C++ kernels underneath).
"""

from __future__ import annotations

import math
import struct

import torch

MASK32 = 0xFFFFFFFF
# Philox-4x32 multipliers and Weyl key increments (Salmon et al. 2011, Random123).
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10

# Counter word 3 separates independent draws made at the same (seed, position): the purpose of the draw.
STREAM_TOKEN = 0  # the ordinary draw (and a speculative round's bonus token)
STREAM_DRAFT = 1  # a speculative backend's draft token
STREAM_ACCEPT = 2  # the uniform that accepts or rejects a draft
STREAM_RESIDUAL = 3  # the draw from the residual (p - q)+ after a rejection


def philox4x32(counter: tuple[int, int, int, int], key: tuple[int, int],
               rounds: int = PHILOX_ROUNDS) -> tuple[int, int, int, int]:
    """Scalar Philox-4x32: the oracle the torch version is tested against."""
    c0, c1, c2, c3 = (c & MASK32 for c in counter)
    k0, k1 = (k & MASK32 for k in key)
    for _ in range(rounds):
        p0 = PHILOX_M0 * c0
        p1 = PHILOX_M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & MASK32,
                          (p0 >> 32) ^ c3 ^ k1, p0 & MASK32)
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def seed_key(seed: int) -> tuple[int, int]:
    """The Philox key of a request seed: the seed modulo 2^64, split into (low, high) words."""
    seed %= 1 << 64
    return seed & MASK32, seed >> 32


def position_words(position: int) -> tuple[int, int]:
    """Counter words 1 and 2: the absolute position as a 64-bit (low, high) pair."""
    if not 0 <= position < 1 << 64:
        raise ValueError(f"position must be in [0, 2^64), got {position}")
    return position & MASK32, position >> 32


def uniform_from_bits(bits: int) -> float:
    """Map a uint32 to a float32 in (0, 1): u = (2 * (bits >> 9) + 1) * 2^-24.

    The top 23 bits select one of 2^23 cell midpoints, so every value is exact in float32, the
    range is [2^-24, 1 - 2^-24] (log(u) and log(-log(u)) are always finite) and the set is
    symmetric about 1/2.
    """
    return (2 * ((bits & MASK32) >> 9) + 1) * 2.0 ** -24


def round_f32(value: float) -> float:
    """Round a Python float (binary64) to the nearest binary32, returned as a Python float."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def gumbel_from_bits(bits: int) -> float:
    """Gumbel noise g = -log(-log(u)), evaluated in float64 and rounded once to float32.

    Rounding a float64 result to float32 makes the value independent of last-ulp differences
    between math libraries (CPU libm, CUDA libdevice) except in vanishingly rare midpoint cases.
    """
    return round_f32(-math.log(-math.log(uniform_from_bits(bits))))


def draw_bits(seed: int, position: int, index: int, stream: int = STREAM_TOKEN) -> int:
    """The uint32 of vocabulary index ``index`` for one draw, scalar oracle.

    One Philox block yields four words, so index i takes word (i mod 4) of the block whose
    counter is (i div 4, position low, position high, stream).
    """
    pos_lo, pos_hi = position_words(position)
    return philox4x32((index >> 2, pos_lo, pos_hi, stream), seed_key(seed))[index & 3]


def gumbel_scalar(seed: int, position: int, index: int, stream: int = STREAM_TOKEN) -> float:
    """The Gumbel noise of vocabulary index ``index`` for one draw, scalar oracle."""
    return gumbel_from_bits(draw_bits(seed, position, index, stream))


def _mulhilo(m: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of m * x for a uint32 constant m and uint32 words x (int64)."""
    p_lo = x * (m & 0xFFFF)  # < 2^48
    p_hi = x * (m >> 16)  # < 2^48; m * x = p_hi * 2^16 + p_lo
    high = (p_hi + (p_lo >> 16)) >> 16
    low = ((p_hi & 0xFFFF) << 16).add_(p_lo).bitwise_and_(MASK32)
    return high, low


def philox4x32_torch(c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor,
                     k0: torch.Tensor, k1: torch.Tensor, rounds: int = PHILOX_ROUNDS
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Vectorised Philox-4x32 over broadcastable int64 tensors holding uint32 words."""
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def uniform_from_bits_torch(bits: torch.Tensor) -> torch.Tensor:
    """Vectorised ``uniform_from_bits``: int64 words -> float32 in (0, 1), exact."""
    return ((bits >> 9) * 2 + 1).to(torch.float32) * 2.0 ** -24


def draw_bits_torch(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int,
                    stream: int = STREAM_TOKEN) -> torch.Tensor:
    """Vectorised ``draw_bits``: uint32 words [B, V] (int64) for seeds [B] and positions [B].

    Seeds must already be reduced to [0, 2^64) and stored as int64 two's complement (see
    ``seed_tensor``); positions must be in [0, 2^63).
    """
    seeds = seeds.to(torch.int64).reshape(-1, 1)  # [B, 1]
    positions = positions.to(torch.int64).reshape(-1, 1)  # [B, 1]
    k0 = seeds & MASK32
    k1 = (seeds >> 32) & MASK32
    blocks = (vocab_size + 3) // 4
    c0 = torch.arange(blocks, dtype=torch.int64, device=seeds.device).reshape(1, -1)  # [1, G]
    c1 = positions & MASK32
    c2 = positions >> 32
    c3 = torch.full_like(c1, stream & MASK32)
    words = philox4x32_torch(c0, c1, c2, c3, k0, k1)  # 4 x [B, G]
    batch = seeds.shape[0]
    # interleave so that column i holds word (i mod 4) of block (i div 4)
    return torch.stack(torch.broadcast_tensors(*words), dim=-1).reshape(batch, 4 * blocks)[:, :vocab_size]


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int,
                 stream: int = STREAM_TOKEN) -> torch.Tensor:
    """Gumbel noise [B, V] float32 for B draws keyed by seeds [B] and positions [B] (int64)."""
    u = uniform_from_bits_torch(draw_bits_torch(seeds, positions, vocab_size, stream))  # [B, V]
    return (-torch.log(-torch.log(u.to(torch.float64)))).to(torch.float32)  # [B, V]


def seed_tensor(seeds: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """Request seeds as int64 [B]: each reduced modulo 2^64, then stored in two's complement."""
    words = [s % (1 << 64) for s in seeds]
    return torch.tensor([w - (1 << 64) if w >= 1 << 63 else w for w in words],
                        dtype=torch.int64, device=device)
