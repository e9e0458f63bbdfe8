"""The A8 FP8 block GEMM against its naive oracle (same per-token, per-block e4m3 activation quantization), on
rows and widths off the tile grid, 128x128 / 32x32 blocks and per-row weight scales; and the A8 result within the
e4m3 activation rounding of the A16 product. On a GPU both paths: cuBLAS's blockwise FP8 where the shape qualifies
(and it must not refuse one that does), the Triton kernel always."""

import pytest
import torch

from _device import DEVICE, ON_GPU
from ninfer.fast.ops.fp8_gemm import cublas, fp8_gemm_naive
from ninfer.fast.ops.fp8_gemm.triton import fp8_gemm, quantize_rows_fp8
from ninfer.fast.ops.qlinear import qlinear_naive, quantize_rows_fp8_naive
from ninfer.testing.numerics import assert_close
from ninfer.testing.quant import pack_weight

# (M, N, K)
SHAPES = [(2048, 4096, 4096), (300, 1024, 2048), (300, 1000, 2048)] if ON_GPU else [(40, 48, 96), (17, 33, 64)]
BLOCKS = [{"block": [128, 128]}, {}] if ON_GPU else [{"block": [32, 32]}, {"block": [16, 64]}, {}]
DTYPE = torch.bfloat16 if ON_GPU else torch.float32


@pytest.mark.parametrize("use_cublas", [True, False], ids=["cublas-where-eligible", "triton"])
@pytest.mark.parametrize("params", BLOCKS, ids=str)
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_fp8_gemm(M, N, K, params, use_cublas):
    w = pack_weight(torch.randn(N, K) * K ** -0.5, "fp8", DEVICE, a8=True, params=params)
    x = torch.randn(M, K, device=DEVICE).to(DTYPE)
    taken = use_cublas and cublas.eligible(x, w)  # on a GPU: 128x128 blocks over whole tiles (M off 16 too)
    assert taken == (ON_GPU and use_cublas and params == {"block": [128, 128]} and N % 128 == 0)
    got = fp8_gemm(x, w, use_cublas=use_cublas)
    assert not taken or cublas.eligible(x, w), "cuBLAS refused a shape it should take"
    assert_close("fp8_gemm", fp8_gemm_naive(x, w).float(), got.float(), 1e-2)
    # 8-bit activations cost about the e4m3 rounding (2^-4 relative per element, averaged down by the dot)
    assert_close("fp8_gemm vs A16", qlinear_naive(x.float(), w), got.float(), 5e-2)


def test_quantize_rows_fp8():
    x = torch.randn(5, 80, device=DEVICE).to(DTYPE)
    q, s = quantize_rows_fp8(x, 32)
    q_ref, s_ref = quantize_rows_fp8_naive(x.float(), 32)
    assert_close("fp8 activation scales", s_ref, s, 1e-6)
    assert_close("fp8 activation codes", q_ref.float(), q.float(), 1e-2)
