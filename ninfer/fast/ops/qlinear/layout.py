"""The device form of a quantized weight: the artifact's planes as torch tensors, plus what the kernels need to
address them (docs/artifact-format.md "Numeric formats", docs/quantization.md "fast Program").

One ``QuantWeight`` is a [N, K] matrix or a stack [E, N, K] (MoE experts) in one of four kinds:

    kind   data                          scales                                   row_scale
    FP8    e4m3 [.., N, K]               fp32 [.., ceil(N/br), ceil(K/bc)]       -
    INT4   uint8 [.., N, K/2]            fp16/bf16 [.., N, K/g]                   -
    INT5   uint8 [.., N, K*5/8]          fp16/bf16 [.., N, K/g]                   -
    INT8   uint8 [.., N, K]              fp16/bf16 [.., N, K/g]                   -
    NVFP4  uint8 [.., N, K/2]            e4m3 [.., N, K/16]                       fp32 [.., N]

plus, for the int kinds, the optional ``zeros`` uint8 [.., N, K/g] (zero code per group; 2^(b-1) without) and
``perm`` int32 [.., K] (act-order: stored column j is logical column perm[j], so ``W @ x == W_stored @ x[perm]``).

The stored bytes are the artifact's, with exact re-layouts that let row-fused parents (``concat_rows``) keep one
kernel call: a per-row fp8 scale is a [br=1, bc=K] block, and NVFP4's global scales (per tensor, or per
``global_rows`` rows) are repeated per row (4 bytes a row), so parts with different global scales fuse. FP8 parts
whose row counts are not multiples of the block's rows fuse with their block scales repeated per row (br = 1;
``bc``-column blocks unchanged). Parts with act-order permutations never fuse (each has its own column order).
After fusion, int4 matrices take the decode GEMV's tile order (``fastgemv.to_tiles``: ``tiled``, a permutation
inside each group recorded in ``perm``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

import torch

# the prefill path dequantizes at most this many bytes of dense weight at a time (a transient of the memory plan)
DEQUANT_CHUNK_BYTES = 256 << 20


class QKind(enum.Enum):
    FP8 = "fp8_e4m3"
    INT4 = "int4"
    INT5 = "int5"
    INT8 = "int8"
    NVFP4 = "nvfp4"

    @property
    def bits(self) -> int:
        return {QKind.FP8: 8, QKind.INT4: 4, QKind.INT5: 5, QKind.INT8: 8, QKind.NVFP4: 4}[self]


@dataclass(frozen=True, eq=False)
class QuantWeight:
    kind: QKind
    shape: tuple[int, ...]  # logical [N, K] or [E, N, K]
    data: torch.Tensor
    scales: torch.Tensor  # always rank(shape): per-row fp8 scales are [.., N, 1]
    row_scale: torch.Tensor | None = None  # NVFP4's global scale per row, fp32 [.., N]
    block_rows: int = 1  # rows sharing one scale (fp8 block rows; 1 otherwise)
    block_cols: int = 16  # columns sharing one scale: fp8 block cols (K when per row), int group size, 16 for NVFP4
    a8: bool = False  # every Use of the weight allows 8-bit activations
    zeros: torch.Tensor | None = None  # int kinds: uint8 [.., N, K/g] zero codes
    perm: torch.Tensor | None = None  # int kinds, act-order: int32 [.., K]
    tiled: bool = False  # int4 in fastgemv's tile order (perm is the tile permutation), set at load by to_tiles

    @property
    def n(self) -> int:
        return self.shape[-2]

    @property
    def k(self) -> int:
        return self.shape[-1]

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.data, self.scales, self.row_scale, self.zeros, self.perm) if t is not None]

    def expert(self, e: int) -> "QuantWeight":
        """Expert e of an [E, N, K] stack as an [N, K] weight (views)."""
        def at(t):
            return None if t is None else t[e]
        return replace(self, shape=self.shape[1:], data=self.data[e], scales=self.scales[e],
                       row_scale=at(self.row_scale), zeros=at(self.zeros), perm=at(self.perm))


def dequant_transient_bytes(w: QuantWeight, act_bytes: int) -> int:
    """The dense transient a prefill call on w allocates: one row chunk, or a whole expert stack."""
    dense = act_bytes
    for d in w.shape:
        dense *= d
    return dense if len(w.shape) == 3 else min(dense, DEQUANT_CHUNK_BYTES + w.k * act_bytes * w.block_rows)


def from_planes(fmt: str, dtype: str, params: dict, shape: tuple[int, ...], planes: dict[str, torch.Tensor],
                a8: bool) -> QuantWeight:
    """The artifact's planes of one binding (torch tensors, fp8 as float8_e4m3fn, on the target device) ->
    QuantWeight. Raises ValueError for a layout the kernels do not cover."""
    shape = tuple(shape)
    data, scales = planes["data"], planes["scales"]
    if fmt == "fp8_e4m3":
        block = params.get("block")
        if block is None:
            return QuantWeight(QKind.FP8, shape, data, scales.reshape(*shape[:-1], 1), None, 1, shape[-1], a8)
        br, bc = int(block[0]), int(block[1])
        if len(shape) != 2 and br != 1 and scales.shape[-2] * br < shape[-2]:
            raise ValueError(f"fp8 block scales {tuple(scales.shape)} do not cover shape {list(shape)}")
        return QuantWeight(QKind.FP8, shape, data, scales, None, br, bc, a8)
    if fmt == "int_group":
        kind = {"int4": QKind.INT4, "int5": QKind.INT5, "int8": QKind.INT8}[dtype]
        return QuantWeight(kind, shape, data, scales, None, 1, int(params["group_size"]), a8,
                           zeros=planes.get("zeros"), perm=planes.get("perm"))
    if fmt == "nvfp4":
        # the input_scale plane is for A4 execution, which Hopper has no tensor cores for: weight-only here
        g = planes["global_scale"].float()
        r = params.get("global_rows")
        if r is None:
            row = g.reshape(-1)[:1].expand(*shape[:-1]).contiguous()
        else:
            row = g.reshape(*shape[:-2], -1).repeat_interleave(int(r), dim=-1).contiguous()
        return QuantWeight(QKind.NVFP4, shape, data, scales, row, 1, 16, a8)
    raise ValueError(f"no quantized kernel layout for format {fmt!r}")


def unsupported(w: QuantWeight) -> str | None:
    """Why the Triton kernels cannot run w (None: they can): tiles need K >= 16 and power-of-two column blocks, so
    a tile never spans two scales. Checked once at load, never per call."""
    K, bc = w.k, w.block_cols
    if K < 16:
        return f"K = {K} < 16"
    if w.kind == QKind.FP8 and bc < K and (bc < 16 or bc & (bc - 1)):
        return f"fp8 block columns {bc} (the kernels need a power of two >= 16)"
    if w.kind in (QKind.INT4, QKind.INT5, QKind.INT8) and (bc < 16 or bc & (bc - 1)):
        return f"group size {bc} (the kernels need a power of two >= 16)"
    return None


def a8_block(w: QuantWeight) -> int | None:
    """The activation block (= the K tile) of an FP8 weight's A8 GEMM (``ninfer.fast.ops.fp8_gemm``), or None where
    it has none: not allowed by every Use, or column blocks outside 32..128 (a per-row-scaled weight takes 128-column
    activation blocks)."""
    if not w.a8 or w.kind != QKind.FP8 or len(w.shape) != 2:
        return None
    bc = w.block_cols
    if bc >= w.k:
        return 128
    return bc if bc in (32, 64, 128) else None



def _per_row(w: QuantWeight) -> QuantWeight:
    """FP8 block scales repeated per row (exact: each row keeps its block's scale)."""
    if w.block_rows == 1:
        return w
    s = w.scales.repeat_interleave(w.block_rows, dim=-2)[..., :w.n, :].contiguous()
    return replace(w, scales=s, block_rows=1)


def fusable(parts: list[QuantWeight]) -> bool:
    """One kernel can run the parts' row concatenation: same kind, rank 2, same column blocking."""
    p0 = parts[0]
    if len(parts) > 1 and any(p.perm is not None for p in parts):
        return False
    return all(p.kind == p0.kind and len(p.shape) == 2 and p.k == p0.k and p.block_cols == p0.block_cols
               and p.scales.dtype == p0.scales.dtype and (p.zeros is None) == (p0.zeros is None) for p in parts)


def concat_rows(parts: list[QuantWeight]) -> QuantWeight:
    """Row concatenation of ``fusable`` parts: the planes concatenated, a8 only if every part allows it."""
    p0 = parts[0]
    if len(parts) == 1:
        return p0
    if p0.kind == QKind.FP8:
        br = p0.block_rows
        aligned = all(p.block_rows == br for p in parts) and all(p.n % br == 0 for p in parts[:-1])
        if not aligned:
            parts = [_per_row(p) for p in parts]
    rows = sum(p.n for p in parts)
    def cat(name):
        return None if getattr(p0, name) is None else torch.cat([getattr(p, name) for p in parts])
    return QuantWeight(p0.kind, (rows, p0.k), cat("data"), cat("scales"), cat("row_scale"), parts[0].block_rows,
                       p0.block_cols, all(p.a8 for p in parts), zeros=cat("zeros"))


@dataclass(frozen=True, eq=False)
class Segments:
    """A fused projection whose parts cannot share one kernel (dense next to quantized, or different kinds): each
    part runs alone and the outputs are concatenated along the columns in order."""
    parts: tuple  # of torch.Tensor | QuantWeight

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[-1])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes if isinstance(p, QuantWeight) else p.numel() * p.element_size() for p in self.parts)
