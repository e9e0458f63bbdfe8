"""gemv and gemv_swiglu vs their naive oracles: every row count, widths off the tile grid, strided x, forced split-K
(partials summed by the last program of each row block, its arrival counters left at zero), NaN-poisoned outputs; the
RMSNorm prologue (rows at different scales, split-K) and the residual epilogue (in place, twice)."""

import pytest
import torch

from _device import DEVICE, DOT_IO_DTYPES, IO_DTYPES, ON_GPU
from ninfer.fast.ops.gemv import GemvConfig, gemv, gemv_naive, gemv_swiglu, gemv_swiglu_naive
from ninfer.fast.ops.gemv.triton import _arrivals
from ninfer.testing.numerics import assert_close

# (N, K): the GPU checks decode projections of 0.8B (1024 -> 7168), 9B (4096 -> 4096, 12288 -> 4096) and the
# 35B-A3B router (2048 -> 257)
SHAPES = [(7168, 1024), (4096, 4096), (4096, 12288), (257, 2048)] if ON_GPU else [(60, 60), (63, 63), (97, 200)]
# configurations that force split-K, uneven last splits and tiles wider than K
SPLITS = [GemvConfig(32, 256, 5), GemvConfig(16, 128, 8), GemvConfig(64, 128, 3)] if ON_GPU \
    else [GemvConfig(16, 16, 3), GemvConfig(32, 64, 2), GemvConfig(16, 256, 4)]
ROWS = [1, 3, 8]


def _tol(dtype):
    return 1e-2 if dtype == torch.bfloat16 else 1e-5


def _inputs(M, N, K, dtype):
    x = torch.randn(M, K, device=DEVICE).to(dtype)
    w = (torch.randn(N, K, device=DEVICE) * K ** -0.5).to(dtype)
    return x, w


def _arrivals_clean():
    return all(not t.any() for t in _arrivals.values())


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("M", ROWS)
def test_gemv(M, N, K, dtype):
    x, w = _inputs(M, N, K, dtype)
    y = gemv(x, w, out=torch.full((M, N), float("nan"), device=DEVICE, dtype=dtype))
    assert_close("gemv", gemv_naive(x, w), y, _tol(dtype))
    assert _arrivals_clean()


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("config", SPLITS, ids=lambda c: f"bw{c.rows}_bk{c.bk}_s{c.splits}")
@pytest.mark.parametrize("M", [1, 8, 16])
def test_gemv_split(M, config, dtype):
    N, K = SHAPES[-1]
    x, w = _inputs(M, N, K, dtype)
    ref = gemv_naive(x, w)
    # twice: the second call finds the counters the first one left, which must be zero again
    for _ in range(2):
        assert_close("gemv.split", ref, gemv(x, w, config=config), _tol(dtype))
        assert _arrivals_clean()


def test_gemv_strided_views():
    # x a column window of a wider activation, w a row slice of a fused weight, out a column window: the columns
    # around it stay untouched
    M, N, K = 5, *SHAPES[1]
    big_x = torch.randn(M, K + 24, device=DEVICE)
    big_w = torch.randn(N + 40, K, device=DEVICE)
    x, w = big_x[:, 7:7 + K], big_w[17:17 + N]
    big_out = torch.full((M, N + 9), float("nan"), device=DEVICE)
    gemv(x, w, out=big_out[:, 4:4 + N])
    assert_close("gemv.strided", gemv_naive(x, w), big_out[:, 4:4 + N], 1e-5)
    assert big_out[:, :4].isnan().all() and big_out[:, 4 + N:].isnan().all()


def test_gemv_fp32_out_from_bf16():
    # a bf16 GEMV may write fp32 (logits) without rounding in between
    x, w = _inputs(4, *SHAPES[0], torch.bfloat16)
    y = gemv(x, w, out=torch.empty(4, SHAPES[0][0], device=DEVICE))
    assert_close("gemv.fp32_out", torch.nn.functional.linear(x.double(), w.double()), y, 1e-5)


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("config", [None, SPLITS[0]], ids=["auto", "split"])
@pytest.mark.parametrize("M", [1, 8])
def test_gemv_swiglu(M, config, dtype):
    # I off the tile grid: 35B-A3B's shared expert (I = 512) on the GPU
    I, K = (512, 2048) if ON_GPU else (49, 63)
    x, w = _inputs(M, 2 * I, K, dtype)
    y = gemv_swiglu(x, w, out=torch.full((M, I), float("nan"), device=DEVICE, dtype=dtype), config=config)
    assert_close("gemv_swiglu", gemv_swiglu_naive(x, w), y, _tol(dtype))
    assert _arrivals_clean()


# the norm prologue rounds the normed x to the io dtype before tl.dot, and the interpreter's fp32 -> bf16
# conversion truncates (1% off in bf16): those checks run bf16 on the GPU only
def _norm_inputs(M, K, dtype):
    # rows at very different scales: the prologue's rstd is per row
    x = (torch.randn(M, K, device=DEVICE) * torch.logspace(-1, 1, M, device=DEVICE)[:, None]).to(dtype)
    return x, (torch.randn(K, device=DEVICE) * 0.3).to(dtype)


@pytest.mark.parametrize("dtype", DOT_IO_DTYPES, ids=str)
@pytest.mark.parametrize("config", [None] + SPLITS, ids=lambda c: "auto" if c is None else f"s{c.splits}_bk{c.bk}")
@pytest.mark.parametrize("M", [1, 3, 8])
def test_gemv_norm_prologue(M, config, dtype):
    # both forms of the fused norm: in the loop (auto, and bk 256 > K: one program per row block) and the prologue
    # (split-K), where every split normalises with the rstd of the whole row, not of its own K range
    N, K = SHAPES[-1]
    x, nw = _norm_inputs(M, K, dtype)
    w = _inputs(M, N, K, dtype)[1]
    y = gemv(x, w, out=torch.full((M, N), float("nan"), device=DEVICE, dtype=dtype), config=config,
             norm_weight=nw, eps=1e-6)
    assert_close("gemv.norm", gemv_naive(x, w, norm_weight=nw, eps=1e-6), y, _tol(dtype))
    assert _arrivals_clean()


@pytest.mark.parametrize("dtype", DOT_IO_DTYPES, ids=str)
@pytest.mark.parametrize("config", [None, SPLITS[0]], ids=["auto", "split"])
@pytest.mark.parametrize("M", [1, 8])
def test_gemv_swiglu_norm_prologue(M, config, dtype):
    I, K = (512, 2048) if ON_GPU else (49, 63)
    x, nw = _norm_inputs(M, K, dtype)
    w = _inputs(M, 2 * I, K, dtype)[1]
    y = gemv_swiglu(x, w, out=torch.full((M, I), float("nan"), device=DEVICE, dtype=dtype), config=config,
                    norm_weight=nw, eps=1e-5)
    assert_close("gemv_swiglu.norm", gemv_swiglu_naive(x, w, norm_weight=nw, eps=1e-5), y, _tol(dtype))


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("config", [None] + SPLITS, ids=lambda c: "auto" if c is None else f"s{c.splits}_bk{c.bk}")
@pytest.mark.parametrize("M", [1, 5, 8])
def test_gemv_residual_in_place(M, config, dtype):
    # the residual stream updated in place, the last split of each row block adding it; twice, so a second pass
    # adds to the first one's result and the counters start clean
    N, K = SHAPES[-1]
    x, w = _inputs(M, N, K, dtype)
    h = torch.randn(M, N, device=DEVICE).to(dtype) * 4
    ref = gemv_naive(x, w, residual=gemv_naive(x, w, residual=h))
    for _ in range(2):
        assert gemv(x, w, out=h, config=config, residual=h) is h
        assert _arrivals_clean()
    assert_close("gemv.residual", ref, h, _tol(dtype))


def test_gemv_residual_norm_to_new_buffer():
    # both fusions at once into a NaN-poisoned output; the residual is only read
    M, (N, K) = 3, SHAPES[1]
    x, nw = _norm_inputs(M, K, torch.float32)
    w = _inputs(M, N, K, torch.float32)[1]
    h = torch.randn(M, N, device=DEVICE)
    h0 = h.clone()
    y = gemv(x[:, :K], w, out=torch.full((M, N), float("nan"), device=DEVICE), norm_weight=nw, eps=1e-6, residual=h)
    assert_close("gemv.norm_residual", gemv_naive(x, w, norm_weight=nw, eps=1e-6, residual=h0), y, 1e-5)
    assert torch.equal(h, h0)


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("config", [None] + SPLITS, ids=lambda c: "auto" if c is None else f"s{c.splits}_bk{c.bk}")
def test_gemv_one_row_fma_form(config, dtype, monkeypatch):
    """The dot-free one-row form (``ONE_ROW = "fma"``, `row._fma_row`) at one row: widths and K off its tile (K
    masked), split-K, SwiGLU, both fused norms (in its loop without a split, the prologue's rstd with one: bf16 on
    the GPU alone, as above) and the residual epilogue in place; NaN-poisoned outputs."""
    from ninfer.fast.ops.gemv import triton as gemv_triton

    monkeypatch.setattr(gemv_triton, "ONE_ROW", "fma")
    for N, K in SHAPES:
        x, w = _inputs(1, N, K, dtype)
        y = gemv(x, w, out=torch.full((1, N), float("nan"), device=DEVICE, dtype=dtype), config=config)
        assert_close(f"gemv.fma {N}x{K}", gemv_naive(x, w), y, _tol(dtype))
        h = torch.randn(1, N, device=DEVICE).to(dtype)
        ref = gemv_naive(x, w, residual=h)
        assert gemv(x, w, out=h, config=config, residual=h) is h
        assert_close(f"gemv.fma residual {N}x{K}", ref, h, _tol(dtype))
    I, K = (512, 2048) if ON_GPU else (49, 63)
    x, w = _inputs(1, 2 * I, K, dtype)
    y = gemv_swiglu(x, w, out=torch.full((1, I), float("nan"), device=DEVICE, dtype=dtype), config=config)
    assert_close("gemv_swiglu.fma", gemv_swiglu_naive(x, w), y, _tol(dtype))
    if dtype in DOT_IO_DTYPES:
        N, K = SHAPES[-1]
        x, nw = _norm_inputs(1, K, dtype)
        w = _inputs(1, N, K, dtype)[1]
        y = gemv(x, w, out=torch.full((1, N), float("nan"), device=DEVICE, dtype=dtype), config=config,
                 norm_weight=nw, eps=1e-6)
        assert_close("gemv.fma norm", gemv_naive(x, w, norm_weight=nw, eps=1e-6), y, _tol(dtype))
    assert _arrivals_clean()
