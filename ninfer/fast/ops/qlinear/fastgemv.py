"""Decode GEMV kernels specialised for int4 groups and FP8 weights, built to stream the packed bytes at HBM
bandwidth: the generic ``qgemv`` decodes each K tile with reshapes, joins and an int->float conversion per weight
(about as slow as reading bf16, docs/performance.md), while at 4 bits the weight read leaves only a few
instructions per weight.

int4 (``to_tiles``, done once at load): within every 128-column tile of a row, stored column ``p = 8j + t`` (nibble
t of int32 word j) holds logical column ``16t + j``. So one int32 load brings 8 codes, nibble t of the 16 words of a
tile pairs with the contiguous activations ``x[k0 + 16t : k0 + 16t + 16]``, and no reshape is needed. The layout is
the act-order mechanism (``perm`` = the tile permutation), so every other path (``naive.py``, the prefill
dequantizer, the generic GEMV) runs the tiled weight unchanged. A code becomes a float without an int->float
conversion: or-ed into the mantissa of 2^23 (``0x4B000000``) it reads as 2^23 + u, and subtracting 2^23 + 8 (the
symmetric zero) gives u - 8 exactly. Nibbles 0..4 are masked in place (value (u - 8) * 16^t, the power folded into
x, exact: a power of two), nibbles 5..7 after one shift per word: one logic op, one add and one FMA per weight. A
tile is one group (g a multiple of 128), so its scale multiplies the tile's partial sum per row, and a zero point
``z`` subtracts ``z * sum(x)`` from it.

FP8 (stored layout): e4m3 converts natively; a K tile never spans two column blocks, so the block scale also
multiplies the tile's partial sum per row. Its kernels live in `fp8_gemv.py` (the tile forms) and `fp8_row.py` (the
one-row "row" form); this module picks the form and launches them.

Both take the row count M either through ``tl.dot`` (x padded to 16 rows, the decoded tile in bf16, exact: at most
4 significant bits times a power of two, e4m3's 4) or dot-free (``use_dot=False``: fp32 FMAs in registers, an
accumulator per (row, column) reduced once at the end). The epilogue is the dense GEMV's (split-K by last arrival,
fused SwiGLU).
"""

from __future__ import annotations

from dataclasses import replace

import os

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl
from ninfer.fast.ops.gemv.triton import _arrival_table, _finish, _num_sms, _tile_rows

from .fp8_gemv import _fp8_kernel
from .fp8_row import ROWS, _fp8_row_kernel, tile as row_tile
from .fp8_rows import _fp8_rows_kernel, fits as rows_fit
from .layout import QKind, QuantWeight

TILE = 128  # int4 tile: 16 int32 words
_MAX_SPLITS = 8
WIDE_BK = 512  # the FP8 one-row K tile over whole 128-column blocks (`_config`)
NARROW_R = 4096  # the row form's weights of at most this many rows take 128-row tiles (`_fp8_row`)
# FP8's form at one row: "dot" (x padded to 16 rows through tl.dot, 64 weight rows a program), "vector" (the
# dot-free form of `_fp8_kernel`) or "row" (`fp8_row`, where the weight fits it; else "dot"). "dot" over "vector":
# the 9B decode step at B=1 through the Engine 5.51 ms against 8.38 (35B-A3B 4.99 against 5.19; thirteenth session,
# H100, bench_quant.py "fp8:dot" / "fp8:vector"). "row" over "dot" (seventeenth and eighteenth sessions, H100): the 9B
# step at B=1 4.72-4.74 ms against 5.26, and each 9B projection 10-20% faster alone (bench_qgemv.py)
FP8_ONE_ROW = "row"
# FP8 through tl.dot in f16 instead of bf16 (x scaled per row by a power of two into f16's range, `_f16_scales`):
# the weight's conversion loses its quarter-rate F2F per weight (docs/quantization.md). Opt-in: the 9B step at B = 2,
# 4, 8 5.41 / 5.61 / 6.13 ms against bf16 operands' 5.39 / 5.58 / 6.03 (eighteenth session, H100, "fp8:f16")
FP8_F16_DOT = False
# FP8 at 2..4 rows through the dot-free "rows" form (`fp8_rows`: each weight converted once for every row, no
# quarter-rate F2F) instead of the padded tl.dot. Opt-in until a GPU run says (bench_quant.py "fp8:rows",
# bench_qgemv.py "fp8rows"); built in the nineteenth session without a device
FP8_ROWS = False
# the row form launches with PDL (`ninfer.fast.ops.pdl`) where the switch is on. Eighteenth session, H100: 0.3-0.8 us
# off a call (bench_qgemv.py: 9B out_proj 8.8 against 9.6 us, down 21.7 against 22.4), the 9B step at B=1 4.51 ms
# against 4.56 (bench_quant.py "fp8:pdl"); a prefetch of the first weight tile before the wait, carried across
# the loop's iterations, made each call 5-15 us slower and went
_WORDS = TILE // 8


def tileable(w: QuantWeight) -> bool:
    """An int4 matrix the tiled kernel can run: groups of whole tiles, no act-order permutation of its own."""
    return (w.kind == QKind.INT4 and len(w.shape) == 2 and w.perm is None and not w.tiled and w.k % TILE == 0
            and w.block_cols % TILE == 0)


def tile_perm(K: int, device) -> torch.Tensor:
    """perm[p]: the logical column stored at column p of the tile order (int32 [K])."""
    p = torch.arange(K, device=device)
    q = p % TILE
    return (p - q + (q % 8) * _WORDS + q // 8).to(torch.int32)


def to_tiles(w: QuantWeight) -> QuantWeight:
    """w with its int4 codes in the tile order (exact: a column permutation inside each group), or w unchanged
    where the tiled kernel does not apply."""
    if not tileable(w):
        return w
    perm = tile_perm(w.k, w.device)
    codes = torch.stack([w.data & 15, w.data >> 4], dim=-1).view(w.n, w.k)
    stored = codes.index_select(1, perm)  # stored column p holds logical column perm[p]
    data = (stored[:, 0::2] | (stored[:, 1::2] << 4)).contiguous()  # byte j: stored 2j low, 2j + 1 high
    return replace(w, data=data, perm=perm, tiled=True)


def fast_kind(w: QuantWeight) -> bool:
    """Whether ``qgemv_fast`` runs w (2-D tiled int4, or 2-D FP8 whose column blocks the K tile fits in)."""
    if len(w.shape) != 2:
        return False
    return w.tiled or w.kind == QKind.FP8  # load refused FP8 blocks the tile cannot fit (layout.unsupported)


@triton.jit
def _nibble(words, T: tl.constexpr, C: tl.constexpr):
    """Nibble T of each int32 word as fp32 (u - C) * 16^P: in place (P = T) while it lies inside the 23 mantissa
    bits, nibbles 5..7 after one shift by 12 bits (P = T - 3)."""
    P: tl.constexpr = T - 3 * (T >= 5)  # where nibble T sits when read, in nibbles
    if T >= 5:
        words = words >> 12
    bits = (words & (15 << (4 * P))) | 0x4B000000
    return bits.to(tl.float32, bitcast=True) - (8388608.0 + C * (1 << (4 * P)))


@triton.jit
def _int4_tile(x_rows, mask_m, w_rows, valid, k0, C: tl.constexpr, BM: tl.constexpr, BW: tl.constexpr,
               HAS_ZERO: tl.constexpr, USE_DOT: tl.constexpr, FP32_DOT: tl.constexpr):
    """sum over the tile's 128 columns of (u - C) * x: [BW, BM] with tl.dot (the decoded weight is the A operand,
    so the compiler converts the packed words, not 8 decoded tiles, to its layout), else [BM, BW, 16] (per word);
    plus sum(x) over the tile ([BM, 16], zeros when not HAS_ZERO)."""
    j = tl.arange(0, 16)
    words = tl.load(w_rows + (k0 // 8 + j)[None, :], mask=valid[:, None], other=0)  # [BW, 16] int32
    if USE_DOT:
        part = tl.zeros((BW, BM), dtype=tl.float32)
    else:
        part = tl.zeros((BM, BW, 16), dtype=tl.float32)
    xsum = tl.zeros((BM, 16), dtype=tl.float32)
    for t in tl.static_range(8):
        xt = tl.load(x_rows + (k0 + 16 * t + j)[None, :], mask=mask_m[:, None], other=0.0).to(tl.float32)
        if HAS_ZERO:
            xsum += xt
        xs = xt * (1.0 / (1 << (4 * (t - 3 * (t >= 5)))))  # the nibble's power of 16, exact
        v = _nibble(words, t, C)  # [BW, 16]
        if USE_DOT:
            if FP32_DOT:
                part += tl.dot(v, tl.trans(xs), input_precision="ieee")
            else:
                part += tl.dot(v.to(tl.bfloat16), tl.trans(xs.to(tl.bfloat16)))
        else:
            part += v[None, :, :] * xs[:, None, :]
    return part, xsum


@triton.jit
def _int4_tile_vec(x_ptr, words, k0, C: tl.constexpr, BW: tl.constexpr, HAS_ZERO: tl.constexpr):
    """``_int4_tile`` for one row of x and the tile's loaded words, kept 2-D: [BW, 16] per word, and sum(x) [16].
    x's vectors are slices of the weight tile's layout, so they need no conversion through shared memory."""
    j = tl.arange(0, 16)
    part = tl.zeros((BW, 16), dtype=tl.float32)
    xsum = tl.zeros((16,), dtype=tl.float32)
    for t in tl.static_range(8):
        xt = tl.load(x_ptr + k0 + 16 * t + j).to(tl.float32)
        if HAS_ZERO:
            xsum += xt
        part += _nibble(words, t, C) * (xt * (1.0 / (1 << (4 * (t - 3 * (t >= 5))))))[None, :]
    return part, xsum


@triton.jit
def _int4_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, part_ptr, arrive_ptr, M, R, K, tiles_per, num_splits, half, G,
                 stride_x, stride_w, stride_s, stride_z, stride_y, BM: tl.constexpr, BW: tl.constexpr,
                 HAS_ZERO: tl.constexpr, SPLIT: tl.constexpr, SWIGLU: tl.constexpr, USE_DOT: tl.constexpr,
                 FP32_DOT: tl.constexpr):
    pid = tl.program_id(0)
    rows, valid = _tile_rows(pid, half, R, BW, SWIGLU)
    m = tl.arange(0, BM)
    mask_m = m < M
    x_rows = x_ptr + m[:, None].to(tl.int64) * stride_x  # [BM, 1]
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w  # [BW, 1], in int32 words
    # whole tiles per split: the compiler sees k_lo as a multiple of 128 and loads 16-byte vectors of words
    k_lo = tl.program_id(1) * tiles_per * 128
    k_hi = tl.minimum(k_lo + tiles_per * 128, K)
    VEC: tl.constexpr = BM == 1 and not USE_DOT
    if USE_DOT:
        acc = tl.zeros((BW, BM), dtype=tl.float32)
    elif VEC:
        acc = tl.zeros((BW, 16), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BW, 16), dtype=tl.float32)
    j = tl.arange(0, 16)
    if VEC:
        # the next tile's words load while this one decodes: the loop's only HBM stream, two tiles in flight
        nxt = tl.load(w_rows + (k_lo // 8 + j)[None, :], mask=valid[:, None], other=0)
    for k0 in range(k_lo, k_hi, 128):
        if VEC:
            words = nxt
            more = (k0 + 128 + j * 0) < k_hi  # [16]: a tile follows in this split
            nxt = tl.load(w_rows + (k0 // 8 + 16 + j)[None, :], mask=valid[:, None] & more[None, :], other=0)
            part, xsum = _int4_tile_vec(x_ptr, words, k0, 0 if HAS_ZERO else 8, BW, HAS_ZERO)
        else:
            part, xsum = _int4_tile(x_rows, mask_m, w_rows, valid, k0, 0 if HAS_ZERO else 8, BM, BW, HAS_ZERO,
                                    USE_DOT, FP32_DOT)
        g = k0 // G
        s = tl.load(s_ptr + rows.to(tl.int64) * stride_s + g, mask=valid, other=0.0).to(tl.float32)  # [BW]
        if HAS_ZERO:
            z = tl.load(z_ptr + rows.to(tl.int64) * stride_z + g, mask=valid, other=0).to(tl.float32)
            if USE_DOT:
                part -= z[:, None] * tl.sum(xsum, axis=1)[None, :]
            elif VEC:
                part -= z[:, None] * xsum[None, :]
            else:
                part -= xsum[:, None, :] * z[None, :, None]
        if USE_DOT or VEC:
            acc += part * s[:, None]
        else:
            acc += part * s[None, :, None]
    if USE_DOT:
        out = tl.trans(acc)
    elif VEC:
        out = tl.sum(acc, axis=1)[None, :]
    else:
        out = tl.sum(acc, axis=2)
    _finish(out, y_ptr, part_ptr, arrive_ptr, pid, num_splits, M, R, m, mask_m, rows, valid, stride_y, half, BM, BW,
            SPLIT, SWIGLU, y_ptr, 0, False)


def fp32_dot(x: torch.Tensor) -> bool:
    # the interpreter's bf16 arithmetic is wrong, and fp32 activations must not be rounded to tf32
    return os.environ.get("TRITON_INTERPRET") == "1" or x.dtype == torch.float32


def split_plan(x: torch.Tensor, y: torch.Tensor, blocks: int, M: int, R: int, K: int, bk: int,
               splits: int | None) -> tuple[int, int, torch.Tensor, torch.Tensor]:
    """(columns per split, splits, fp32 partials, arrival table): K split until there are about two programs per
    SM, in whole K tiles (the partials and the table are y, unread, without a split)."""
    if splits is None:
        splits = max(1, min(triton.cdiv(2 * _num_sms(x.device), blocks), triton.cdiv(K, bk), _MAX_SPLITS))
    k_per = triton.cdiv(triton.cdiv(K, splits), bk) * bk
    splits = triton.cdiv(K, k_per)
    if splits == 1:
        return k_per, 1, y, y
    return k_per, splits, torch.empty(splits, M, R, device=x.device, dtype=torch.float32), \
        _arrival_table(x.device, blocks)


def _config(w: QuantWeight, M: int, dot: bool, bw: int | None, bk: int | None = None
            ) -> tuple[int, int, int, int]:
    """(BM, BW, BK, SB): x's padded rows, weight rows per program, the K tile (one int4 tile; FP8: within one column
    block unless ``bk`` asks for whole blocks at one row), the columns one scale entry covers in the tile. From sm_90
    SASS: int4 dot-free at 128 rows spends about 5 instructions a weight (at 64: 6, each thread's x vectors serve
    fewer rows), and at 32 rows tl.dot's four warps decode each weight twice. Measured
    (bench_qgemv.py, H100, the six 9B projections, eighth session, docs/performance.md): FP8 with tl.dot at M = 8
    runs 1.2-1.4x faster at 64 rows a program than at 32 in every shape (x is padded to 16 rows, so every M > 1 runs
    the same tile; one row too by default, ``FP8_ONE_ROW``); FP8 dot-free at M = 1 is best at 32 (64: 1.2-1.4x
    slower), and a 512-wide K tile over four 128-column blocks at 16 rows beats that by 2-5% in in_proj_qkvz,
    gate_up and down (twelfth session, H100: 33.7 / 64.0 / 34.7 us against 34.8 / 65.6 / 36.6), so it is the
    dot-free one-row tile where K allows; int4's defaults are within 15% of the best swept configuration in both
    forms, which no single alternative beats in every shape."""
    bm = 16 if dot else triton.next_power_of_2(M)
    if w.tiled:
        return bm, bw or (64 if dot else 128), TILE, TILE
    # a block as wide as K (one scale entry per row) takes any tile up to K's power of two
    bc = w.block_cols if w.block_cols < w.k else triton.next_power_of_2(w.k)
    if bk is None and bw is None and M == 1 and not dot and bc < WIDE_BK and WIDE_BK % bc == 0 and \
            w.k % WIDE_BK == 0:
        bk, bw = WIDE_BK, 16  # twelfth session: 2-5% faster than 32 rows at 128 in each 9B shape swept
    if bk is None:
        bk = min(128, bc)
    if bk <= bc:
        assert bc % bk == 0, f"qgemv: a K tile of {bk} must divide the {bc}-column blocks"
        return bm, bw or (64 if dot else 32), bk, bk
    # a tile over whole column blocks scales each block's products apart: the dot-free one-row form only
    assert bk % bc == 0 and not dot and M == 1, f"qgemv: a {bk}-wide K tile over {bc}-column blocks"
    return bm, bw or 32, bk, bc


def qgemv_fast(x: torch.Tensor, w: QuantWeight, y: torch.Tensor, swiglu: bool, splits: int | None, bw: int | None,
               num_warps: int, num_stages: int, use_dot: bool | None, bk: int | None = None) -> torch.Tensor:
    """``qgemv`` for a ``fast_kind`` weight (x contiguous along K, y allocated): ``use_dot`` None takes tl.dot for
    M > 1 and the dot-free form for one row (FP8's by ``FP8_ONE_ROW`` unless a K tile ``bk`` is asked for: the
    dot-free one-row tile)."""
    M, K = x.shape
    R = w.n
    n_out = R // 2 if swiglu else R
    one_row = M == 1 and not w.tiled and use_dot is None and bk is None
    row_bk = row_tile(w) if one_row and FP8_ONE_ROW == "row" else None
    if row_bk is not None:
        return _fp8_row(x, w, y, row_bk, swiglu, splits, bw, num_warps, num_stages)
    if FP8_ROWS and use_dot is None and bk is None and not w.tiled and rows_fit(M, row_tile(w)):
        return _fp8_rows(x, w, y, swiglu, splits, bw, num_warps, num_stages)
    dot = (M > 1 or (one_row and FP8_ONE_ROW != "vector")) if use_dot is None else use_dot
    bm, bw, bk, sb = _config(w, M, dot, bw, bk)
    blocks = triton.cdiv(n_out, bw // 2) if swiglu else triton.cdiv(R, bw)
    k_per, splits, part, arrivals = split_plan(x, y, blocks, M, R, K, bk, splits)
    common = dict(BM=bm, BW=bw, SPLIT=splits > 1, SWIGLU=swiglu, USE_DOT=dot, FP32_DOT=fp32_dot(x),
                  num_warps=num_warps, num_stages=num_stages)
    if w.tiled:
        zs = w.zeros if w.zeros is not None else w.scales
        _int4_kernel[(blocks, splits)](
            x, w.data.view(torch.int32), w.scales, zs, y, part, arrivals, M, R, K, k_per // TILE, splits, n_out,
            w.block_cols,
            x.stride(0), w.data.stride(0) // 4, w.scales.stride(0), zs.stride(0), y.stride(0),
            HAS_ZERO=w.zeros is not None, **common)
    else:
        _fp8_kernel[(blocks, splits)](
            x, w.data, w.scales, y, part, arrivals, M, R, K, k_per, splits, n_out, w.block_rows, w.block_cols,
            x.stride(0), w.data.stride(0), w.scales.stride(-2), y.stride(0), BK=bk, SB=sb, EVEN_K=K % bk == 0,
            F16_DOT=dot and FP8_F16_DOT and x.dtype != torch.float32 and sb == bk, **common)
    return y


def _fp8_rows(x: torch.Tensor, w: QuantWeight, y: torch.Tensor, swiglu: bool, splits: int | None, bw: int | None,
              num_warps: int, num_stages: int) -> torch.Tensor:
    """The few-rows "rows" form (`fp8_rows`) at 2..4 rows of x, 64 weight rows a program at 4 warps unless `bw`
    says, K split in 64-column sub-tiles."""
    M, K = x.shape
    R, bw = w.n, bw or ROWS
    n_out = R // 2 if swiglu else R
    blocks = triton.cdiv(n_out, bw // 2) if swiglu else triton.cdiv(R, bw)
    k_per, splits, part, arrivals = split_plan(x, y, blocks, M, R, K, 64, splits)
    on = pdl.active(x)
    _fp8_rows_kernel[(blocks, splits)](
        x, w.data, w.scales, y, part, arrivals, M, R, K, k_per, splits, n_out, w.block_rows, w.block_cols,
        x.stride(0), w.data.stride(0), w.scales.stride(-2), y.stride(0), BM=triton.next_power_of_2(M), BW=bw,
        SPLIT=splits > 1, SWIGLU=swiglu, PDL=on, num_warps=num_warps, num_stages=num_stages, **pdl.launch(on))
    return y


def _fp8_row(x: torch.Tensor, w: QuantWeight, y: torch.Tensor, bk: int, swiglu: bool, splits: int | None,
             bw: int | None, num_warps: int, num_stages: int) -> torch.Tensor:
    """The one-row "row" form (`fp8_row`) for a weight it fits, at its K tile `bk` (`fp8_row.tile`); `bw` None takes
    the measured tile: 128 rows at 8 warps for at most `NARROW_R` rows, else 64 at 4 (eighteenth session,
    bench_qgemv.py on an H100, the 9B projections: out_proj 9.6 us against 10.9, down 22.3 against 25.4,
    while in_proj_qkvz and gate_up ran 10-25% slower at 128)."""
    R = w.n
    if bw is None:
        bw, num_warps = (128, 8) if R <= NARROW_R else (ROWS, 4)
    n_out = R // 2 if swiglu else R
    blocks = triton.cdiv(n_out, bw // 2) if swiglu else triton.cdiv(R, bw)
    k_per, splits, part, arrivals = split_plan(x, y, blocks, 1, R, w.k, bk, splits)
    on = pdl.active(x)
    _fp8_row_kernel[(blocks, splits)](
        x, w.data, w.scales, y, part, arrivals, R, w.k, k_per, splits, n_out, w.block_rows, w.block_cols,
        w.data.stride(0), w.scales.stride(-2), y.stride(0), BW=bw, BK=bk, SPLIT=splits > 1, SWIGLU=swiglu,
        PDL=on, num_warps=num_warps, num_stages=num_stages, **pdl.launch(on))
    return y
