"""Quantized decode GEMV (FP8 block / per-row, int4, int5, NVFP4; int4 also in the fast GEMV's tile order) and the
prefill dequantizer vs the naive oracle on the same packed planes: every decode row count, widths off the tile and
block grid, forced split-K, SwiGLU-fused, the MoE pair mode, tl.dot and dot-free forms; NaN-poisoned outputs. The naive dequantization itself is checked against the
artifact formats' numpy unpack (the stored layout's definition)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from _device import DEVICE, ON_GPU
from ninfer.artifact.formats import get_format
from ninfer.fast.ops.qlinear import concat_rows, dequantize_naive, fusable, qlinear_naive
from ninfer.fast.ops.qlinear.fastgemv import to_tiles
from ninfer.fast.ops.qlinear.triton import dequantize, qgemv, qgemv_pairs, qlinear
from ninfer.testing.numerics import assert_close
from ninfer.testing.quant import RECIPES, pack_planes, pack_weight
from ninfer.testing.sm90 import run_build_script

KINDS = ["fp8", "fp8_row", "int4", "int5", "int8", "int4_zp", "int4_act", "nvfp4", "nvfp4_rows"]
# small groups/blocks on CPU keep the interpreter fast while still spanning several scale blocks per row
SMALL = {"fp8": {"block": [16, 32]}, "fp8_row": {}, "int4": {"group_size": 16}, "int5": {"group_size": 32},
         "int8": {"group_size": 16}, "int4_zp": {"group_size": 16, "zero_point": True, "scale_dtype": "bfloat16"},
         "int4_act": {"group_size": 16, "zero_point": True, "act_order": True}, "nvfp4": {},
         "nvfp4_rows": {"global_rows": 1, "input_scale": True}}
# (N, K): off the 16-row tile, K spanning several blocks; the GPU adds 9B decode projections
SHAPES = [(4096, 4096), (1024, 12288), (257, 2048)] if ON_GPU else [(40, 64), (33, 96)]
DTYPE = torch.bfloat16 if ON_GPU else torch.float32


def _params(kind):
    return RECIPES[kind][2] if ON_GPU else SMALL[kind]


def _weight(kind, N, K, lead=()):
    v = torch.randn(*lead, N, K) * K ** -0.5
    return pack_weight(v, kind, DEVICE, params=_params(kind))


def _tol():
    return 1e-2 if DTYPE == torch.bfloat16 else 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_naive_dequant_is_the_formats_unpack(kind):
    fmt_name, dtype, _ = RECIPES[kind]
    v = torch.randn(48, 64)
    w = pack_weight(v, kind, "cpu", params=SMALL[kind])
    planes = pack_planes(v.numpy(), fmt_name, dtype, SMALL[kind])
    ref = get_format(fmt_name).unpack(planes, (48, 64), dtype, SMALL[kind])
    assert np.array_equal(dequantize_naive(w).numpy(), ref)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("M", [1, 3, 8])
def test_qgemv(kind, N, K, M):
    w = _weight(kind, N, K)
    x = torch.randn(M, K, device=DEVICE).to(DTYPE)
    y = qgemv(x, w, out=torch.full((M, N), float("nan"), device=DEVICE, dtype=DTYPE))
    assert_close(f"qgemv {kind}", qlinear_naive(x, w), y, _tol())
    if M == 1:
        assert_close(f"qgemv {kind} dot-free", qlinear_naive(x, w), qgemv(x, w, use_dot=False), _tol())


@pytest.mark.parametrize("kind", KINDS)
def test_qgemv_split_k_and_swiglu(kind):
    N, K = SHAPES[-1]
    w = _weight(kind, 2 * N, K)
    x = torch.randn(5, K, device=DEVICE).to(DTYPE)
    assert_close(f"qgemv {kind} split-K", qlinear_naive(x, w), qgemv(x, w, splits=3), _tol())
    gate, up = qlinear_naive(x.float(), w).chunk(2, dim=-1)
    assert_close(f"qgemv {kind} swiglu", torch.nn.functional.silu(gate) * up, qgemv(x, w, swiglu=True).float(), _tol())
    # one row takes each kind's own default form (NVFP4: dot-free)
    assert_close(f"qgemv {kind} swiglu, one row", (torch.nn.functional.silu(gate) * up)[:1],
                 qgemv(x[:1], w, swiglu=True).float(), _tol())


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_dequantize_and_fused_rows(kind):
    # a fused parent of parts whose row counts are not multiples of the fp8 block rows: scales go per row
    parts = [_weight(kind, n, SHAPES[-1][1]) for n in (24, 40, 17)]
    if "act" in kind:
        assert not fusable(parts)  # each part has its own column order
        parts = parts[:1]
    w = concat_rows(parts)
    assert torch.equal(dequantize_naive(w), torch.cat([dequantize_naive(p) for p in parts]))
    stored = dequantize_naive(w) if w.perm is None else dequantize_naive(w)[:, w.perm.long()]
    assert_close(f"dequantize {kind}", stored, dequantize(w, torch.float32), 1e-6)  # in stored column order
    x = torch.randn(20, w.k, device=DEVICE).to(DTYPE)
    assert_close(f"qlinear {kind} prefill", qlinear_naive(x, w), qlinear(x, w), _tol())


@pytest.mark.parametrize("kind", ["fp8", "int4", "int4_act", "nvfp4_rows"] if not ON_GPU else KINDS)
def test_qgemv_pairs(kind):
    E, N, K, T, k = 4, 32, 256 if ON_GPU else 64, 3, 2  # K spans whole groups of the real recipes (128) on the GPU
    w = _weight(kind, N, K, lead=(E,))
    x = torch.randn(T * k, K, device=DEVICE).to(DTYPE)
    ids = torch.tensor([[3, 1], [1, 0], [2, 3]], device=DEVICE, dtype=torch.int32)
    pw = torch.rand(T, k, device=DEVICE)
    ref = torch.stack([qlinear_naive(x[p // k:p // k + 1], w.expert(int(ids.view(-1)[p])))[0]
                       for p in range(T * k)])
    got = qgemv_pairs(x, w, ids, k, a_per_pair=False)
    assert_close(f"qgemv_pairs {kind}", ref, got, _tol())
    ref_pp = torch.stack([qlinear_naive(x[p:p + 1], w.expert(int(ids.view(-1)[p])))[0] for p in range(T * k)])
    got_pp = qgemv_pairs(x, w, ids, k, a_per_pair=True, pair_weights=pw, out_dtype=torch.float32)
    assert_close(f"qgemv_pairs {kind} per pair", ref_pp.float() * pw.view(-1, 1), got_pp, _tol())


# int4 in the fast GEMV's tile order: groups of whole 128-column tiles (g = 128 and 256), widths off the row tile
TILED = {"int4": {"group_size": 128}, "int4_zp": {"group_size": 256, "zero_point": True, "scale_dtype": "bfloat16"}}
TILED_SHAPES = [(4096, 4096), (1000, 12288)] if ON_GPU else [(40, 256), (17, 512)]


@pytest.mark.parametrize("kind", list(TILED))
@pytest.mark.parametrize("N,K", TILED_SHAPES)
@pytest.mark.parametrize("M", [1, 3, 8])
def test_tiled_int4_gemv(kind, N, K, M):
    w = pack_weight(torch.randn(N, K) * K ** -0.5, kind, DEVICE, params=TILED[kind])
    t = to_tiles(w)
    assert t.tiled and torch.equal(dequantize_naive(t), dequantize_naive(w))  # the re-layout is exact
    x = torch.randn(M, K, device=DEVICE).to(DTYPE)
    ref = qlinear_naive(x, w)
    for use_dot in (None, True, False):
        y = qgemv(x, t, out=torch.full((M, N), float("nan"), device=DEVICE, dtype=DTYPE), use_dot=use_dot)
        assert_close(f"tiled {kind} use_dot={use_dot}", ref, y, _tol())


@pytest.mark.parametrize("kind", list(TILED))
def test_tiled_int4_split_k_swiglu_prefill(kind):
    N, K = TILED_SHAPES[-1]
    w = pack_weight(torch.randn(2 * N, K) * K ** -0.5, kind, DEVICE, params=TILED[kind])
    t = to_tiles(w)
    x = torch.randn(5, K, device=DEVICE).to(DTYPE)
    for use_dot in (True, False):
        assert_close(f"tiled {kind} split-K", qlinear_naive(x, w), qgemv(x, t, splits=3, use_dot=use_dot), _tol())
        gate, up = qlinear_naive(x.float(), w).chunk(2, dim=-1)
        assert_close(f"tiled {kind} swiglu", torch.nn.functional.silu(gate) * up,
                     qgemv(x, t, swiglu=True, use_dot=use_dot).float(), _tol())
    xp = torch.randn(20, K, device=DEVICE).to(DTYPE)
    assert_close(f"tiled {kind} prefill", qlinear_naive(xp, w), qlinear(xp, t), _tol())


@pytest.mark.parametrize("kind", ["fp8", "fp8_row"])
def test_fp8_gemv_rows_dot_free(kind):
    N, K = SHAPES[-1]
    w = _weight(kind, N, K)
    x = torch.randn(3, K, device=DEVICE).to(DTYPE)
    assert_close(f"fp8 {kind} dot-free rows", qlinear_naive(x, w), qgemv(x, w, use_dot=False), _tol())


@pytest.mark.parametrize("kind", ["fp8", "fp8_row"])
@pytest.mark.parametrize("blocks", [2, 4])
def test_fp8_gemv_wide_tiles_one_row(kind, blocks):
    # a K tile over several column blocks scales each block's products by its own entry (and for per-row scales,
    # one entry over a tile wider than the default); split-K and SwiGLU on the same tile
    N, K = SHAPES[-1]
    w = _weight(kind, 2 * N, K)
    bk = blocks * min(w.block_cols, 32 if not ON_GPU else 128)
    x = torch.randn(1, K, device=DEVICE).to(DTYPE)
    out = torch.full((1, 2 * N), float("nan"), device=DEVICE, dtype=DTYPE)
    assert_close(f"fp8 {kind} tile {bk}", qlinear_naive(x, w), qgemv(x, w, out=out, bk=bk, use_dot=False), _tol())
    assert_close(f"fp8 {kind} tile {bk} split-K", qlinear_naive(x, w), qgemv(x, w, bk=bk, splits=2), _tol())
    gate, up = qlinear_naive(x.float(), w).chunk(2, dim=-1)
    assert_close(f"fp8 {kind} tile {bk} swiglu", torch.nn.functional.silu(gate) * up,
                 qgemv(x, w, swiglu=True, bk=bk).float(), _tol())


def test_fp8_one_row_dot_free_takes_the_wide_tile_where_k_allows():
    """At one row without tl.dot (``use_dot=False``; FP8's one-row default is the row form, ``FP8_ONE_ROW``),
    128-column blocks and K a multiple of 512 take the 512-wide tile at 16 rows (measured 2-5% faster in the 9B
    shapes); other K, more rows or an asked-for tile keep the 128-column tile. The wide path against the oracle,
    NaN-poisoned."""
    from ninfer.fast.ops.qlinear.fastgemv import _config

    blocked = {"block": [128, 128]}
    w = pack_weight(torch.randn(24, 1024) * 1024 ** -0.5, "fp8", DEVICE, params=blocked)
    odd = pack_weight(torch.randn(24, 1152), "fp8", "cpu", params=blocked)
    assert _config(w, 1, False, None) == (1, 16, 512, 128)
    assert _config(odd, 1, False, None) == (1, 32, 128, 128)
    assert _config(w, 2, False, None) == (2, 32, 128, 128) and _config(w, 1, False, 32) == (1, 32, 128, 128)
    x = torch.randn(1, 1024, device=DEVICE).to(DTYPE)
    out = torch.full((1, 24), float("nan"), device=DEVICE, dtype=DTYPE)
    assert_close("fp8 one-row wide tile", qlinear_naive(x, w), qgemv(x, w, out=out, use_dot=False), _tol())
    gate, up = qlinear_naive(x.float(), w).chunk(2, dim=-1)  # 8 rows of each half a program
    out = torch.full((1, 12), float("nan"), device=DEVICE, dtype=DTYPE)
    assert_close("fp8 one-row wide tile swiglu", torch.nn.functional.silu(gate) * up,
                 qgemv(x, w, swiglu=True, out=out, use_dot=False).float(), _tol())
    out = torch.full((1, 24), float("nan"), device=DEVICE, dtype=DTYPE)
    assert_close("fp8 one-row default (the row form)", qlinear_naive(x, w), qgemv(x, w, out=out), _tol())


@pytest.mark.parametrize("block, N, K", [((16, 64), 40, 192), ((32, 128), 33, 256), (None, 70, 192),
                                          (None, 24, 256)])
@pytest.mark.parametrize("pdl", [False] + [True] * ON_GPU)  # PDL's griddepcontrol is PTX: no interpreter runs it
def test_fp8_one_row_row_form(block, N, K, pdl, monkeypatch):
    """The one-row "row" form (``fastgemv.FP8_ONE_ROW``, `fp8_row`): 64- and 128-column blocks (K tiles of 64 and
    128), per-row scales over K not a multiple of 128, rows off its 64-row tile, split-K, SwiGLU; NaN-poisoned
    outputs; on a GPU also launched with PDL (``pdl.ENABLED``). A weight it does not fit (32-column blocks) keeps
    the tl.dot form."""
    from ninfer.fast.ops import pdl as pdl_switch
    from ninfer.fast.ops.qlinear import fastgemv, fp8_row

    monkeypatch.setattr(fastgemv, "FP8_ONE_ROW", "row")
    monkeypatch.setattr(pdl_switch, "ENABLED", pdl)
    kind, params = ("fp8", {"block": list(block)}) if block else ("fp8_row", {})
    w = pack_weight(torch.randn(2 * N, K) * K ** -0.5, kind, DEVICE, params=params)
    assert fp8_row.tile(w) == (128 if K % 128 == 0 else 64)
    x = torch.randn(1, K, device=DEVICE).to(DTYPE)
    for splits, bw in ((None, None), (2, None), (2, 64)):  # the tile of at most NARROW_R rows (128) and 64
        out = torch.full((1, 2 * N), float("nan"), device=DEVICE, dtype=DTYPE)
        assert_close(f"fp8 row {block} splits {splits} rows {bw}", qlinear_naive(x, w),
                     qgemv(x, w, out=out, splits=splits, bw=bw), _tol())
    gate, up = qlinear_naive(x.float(), w).chunk(2, dim=-1)
    out = torch.full((1, N), float("nan"), device=DEVICE, dtype=DTYPE)
    assert_close(f"fp8 row {block} swiglu", torch.nn.functional.silu(gate) * up,
                 qgemv(x, w, swiglu=True, out=out, splits=2).float(), _tol())
    narrow = pack_weight(torch.randn(N, K), "fp8", "cpu", params={"block": [16, 32]})
    assert fp8_row.tile(narrow) is None


@pytest.mark.parametrize("M", [2, 3, 4])
@pytest.mark.parametrize("block, N, K", [((16, 64), 40, 192), (None, 70, 192)] +
                         [((128, 128), 2048, 4096), ((128, 128), 6144, 4096)] * ON_GPU)  # 9B o_proj, in_proj
def test_fp8_few_rows_form(M, block, N, K, monkeypatch):
    """The few-rows "rows" form (``fastgemv.FP8_ROWS``, `fp8_rows`) at 2..4 rows of x: 64-column blocks and per-row
    scales, rows off its 64-row tile, M off its power of two (3: a padding row), split-K, a 32-row tile, SwiGLU;
    NaN-poisoned outputs. At more rows, or a weight the row form does not fit, the tl.dot form runs."""
    from ninfer.fast.ops.qlinear import fastgemv, fp8_rows

    monkeypatch.setattr(fastgemv, "FP8_ROWS", True)
    kind, params = ("fp8", {"block": list(block)}) if block else ("fp8_row", {})
    w = pack_weight(torch.randn(2 * N, K) * K ** -0.5, kind, DEVICE, params=params)
    x = torch.randn(M, K, device=DEVICE).to(DTYPE)
    for splits, bw in ((None, None), (2, None), (3, 32)):
        out = torch.full((M, 2 * N), float("nan"), device=DEVICE, dtype=DTYPE)
        assert_close(f"fp8 rows M={M} {block} splits {splits} rows {bw}", qlinear_naive(x, w),
                     qgemv(x, w, out=out, splits=splits, bw=bw), _tol())
    gate, up = qlinear_naive(x.float(), w).chunk(2, dim=-1)
    out = torch.full((M, N), float("nan"), device=DEVICE, dtype=DTYPE)
    assert_close(f"fp8 rows M={M} {block} swiglu", torch.nn.functional.silu(gate) * up,
                 qgemv(x, w, swiglu=True, out=out, splits=2).float(), _tol())
    assert fp8_rows.fits(M, 64) and not fp8_rows.fits(fp8_rows.MAX_M + 1, 64) and not fp8_rows.fits(M, None)


@pytest.mark.parametrize("M", [1, 3, 8])
def test_fp8_f16_dot(M, monkeypatch):
    """FP8 through tl.dot in f16 (`fastgemv.FP8_F16_DOT`): each row of x scaled by its own power of two into f16's
    range, so rows far outside it (1e6, past f16's 65504, and 1e-6) keep their precision; split-K (each split its
    own scale), SwiGLU; NaN-poisoned outputs. bf16 activations (fp32 ones keep the fp32 dot)."""
    from ninfer.fast.ops.qlinear import fastgemv

    monkeypatch.setattr(fastgemv, "FP8_F16_DOT", True)
    N, K = (40, 256) if not ON_GPU else (1024, 4096)
    w = pack_weight(torch.randn(2 * N, K) * K ** -0.5, "fp8", DEVICE, params={"block": [16, 64]} if not ON_GPU
                    else {"block": [128, 128]})
    x = torch.randn(M, K) * torch.tensor([1e6, 1e-6, 1.0, 30.0] * 2)[:M, None]
    x = x.to(DEVICE).to(torch.bfloat16)
    want = qlinear_naive(x.float(), w)
    for splits in (None, 2):
        out = torch.full((M, 2 * N), float("nan"), device=DEVICE, dtype=torch.bfloat16)
        got = qgemv(x, w, out=out, splits=splits, use_dot=True).float()
        for r in range(M):  # each row on its own scale
            assert_close(f"fp8 f16 dot M={M} row {r} splits {splits}", want[r], got[r], 1e-2)
    gate, up = want.chunk(2, dim=-1)
    out = torch.full((M, N), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    got = qgemv(x, w, out=out, swiglu=True, splits=2, use_dot=True).float()
    ref = torch.nn.functional.silu(gate) * up
    for r in range(M):
        assert_close(f"fp8 f16 dot M={M} row {r} swiglu", ref[r], got[r], 1e-2)


def test_fp8_forms_sm90_build():
    # Hopper's compile on the CPU (Triton's ptxas, a subprocess without the interpreter): the row form keeps every
    # tile in one layout inside its loop (no shared-memory round trip a tile) and fits 5 programs an SM without
    # spills; the dot-free `_fp8_kernel` form beside it converts layouts in its loop, which the count must show.
    # The tl.dot form with f16 operands has no quarter-rate F2F; with bf16 it has one per weight of its tile
    # The row form with PDL: one trigger of the next kernel (PREEXIT) and one wait on the kernel before (ACQBULK),
    # before any load. The few-rows form at 2 and 4 rows keeps the row form's properties
    rows = run_build_script(Path(__file__).with_name("_sm90_fp8_row.py"),
                            ["bf16", "vector", "dot-bf16", "dot-f16", "pdl", "narrow", "rows2", "rows4"])
    by = {(r["form"], r["swiglu"]): r for r in rows}
    assert len(rows) == 9
    for r in (by["row bf16", False], by["row bf16", True], by["row pdl", False]):
        assert r["spill"] == 0 and r["loop_conversions"] == 0 and r["programs"] >= 4 and r["f2f"] == 0, r
    narrow = by["row bf16 128", False]  # 128 rows at 8 warps: twice the threads, the same work a thread
    assert narrow["spill"] == 0 and narrow["loop_conversions"] == 0 and narrow["programs"] >= 2, narrow
    pdl = by["row pdl", False]
    assert pdl["trigger"] == pdl["wait"] == 1 and by["row bf16", False]["wait"] == 0, pdl
    assert pdl["loads_before_wait"] == 0, pdl
    for r in (by["rows 2", False], by["rows 4", False]):  # the few-rows form: the row form's tile, no F2F
        assert r["spill"] == 0 and r["loop_conversions"] == 0 and r["programs"] >= 4 and r["f2f"] == 0, r
    assert by["vector", False]["loop_conversions"] > 0, by["vector", False]
    assert by["dot f16", False]["f2f"] == 0 and by["dot f16", False]["spill"] == 0, by["dot f16", False]
    assert by["dot bf16", False]["f2f"] >= 64, by["dot bf16", False]


def test_to_tiles_leaves_other_layouts():
    # act-order, a group narrower than a tile, and other kinds keep the stored order (the generic kernel)
    for kind, params in (("int4_act", {"group_size": 128, "zero_point": True, "act_order": True}),
                         ("int4", {"group_size": 64}), ("int5", {"group_size": 128}), ("fp8", {"block": [16, 32]})):
        w = pack_weight(torch.randn(8, 256), kind, "cpu", params=params)
        assert to_tiles(w) is w
