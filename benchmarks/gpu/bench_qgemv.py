"""Quantized decode GEMV micro-benchmark: ``qgemv`` (FP8 128x128, int4 g128, NVFP4) on the 9B and 35B-A3B decode
projections at M = 1 and 8, beside the bf16 ``gemv``/cuBLAS on the same shape, with a sweep of kernel configurations
(weight rows per program, stages, warps) to tune the heuristic.

Each case is timed inside a CUDA graph of back-to-back calls cycling through weight copies larger than the L2
cache, so every call streams its weight from HBM. Printed: us per call and TB/s of the bytes really stored.

``--gemm M`` times the prefill side instead: per projection at M rows, bf16 cuBLAS, the A8 ``fp8_gemm`` (and its
activation quantization alone), dequantize-then-cuBLAS per recipe, and ``torch._scaled_mm``'s blockwise FP8 (1x128
activations x 128x128 weights) in the scale layouts cuBLAS may take, each with its error against the naive A8.

Run: python benchmarks/gpu/bench_qgemv.py [--models 9B,35B-A3B] [--shapes ...] [--gemm 8192] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import cuda_ms  # noqa: E402
from quant_weights import RECIPES, random_planes  # noqa: E402
from shapes import config  # noqa: E402

from ninfer.fast.ops.gemv import gemv  # noqa: E402
from ninfer.fast.ops.qlinear import from_planes  # noqa: E402
from ninfer.fast.ops.qlinear.triton import qgemv  # noqa: E402

ROTATE_BYTES = 256 << 20
# (rows per program, stages, warps, tl.dot): the dot-free form sums fp32 products in registers (M = 1 only)
SWEEP = [(32, 4, 4, True), (64, 3, 8, True), (32, 4, 4, False), (64, 4, 4, False), (128, 3, 8, False)]


def shapes(model: str) -> list[tuple[str, int, int]]:
    cfg = config(model)
    H = cfg.hidden_size
    q = cfg.num_attention_heads * cfg.head_dim
    out = [("in_proj_qkvz", cfg.conv_dim + cfg.linear_value_dim, H), ("out_proj", H, cfg.linear_value_dim),
           ("qkv", 2 * q + 2 * cfg.num_key_value_heads * cfg.head_dim, H), ("o_proj", H, q)]
    if not cfg.is_moe:
        out += [("gate_up", 2 * cfg.intermediate_size, H), ("down", H, cfg.intermediate_size)]
    return out


def graph_us(fn, calls: int) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * calls)


def bench_shape(name: str, N: int, K: int, results: list) -> None:
    dense = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
             for _ in range(max(2, ROTATE_BYTES // (N * K * 2)))]
    for M in (1, 8):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        it = iter(range(1 << 30))
        bf16 = min(graph_us(lambda: F.linear(x, dense[next(it) % len(dense)]), 2 * len(dense)),
                   graph_us(lambda: gemv(x, dense[next(it) % len(dense)]), 2 * len(dense)))
        row = {"shape": name, "N": N, "K": K, "M": M, "bf16_us": bf16, "bf16_tb_s": N * K * 2 / bf16 / 1e6}
        for recipe, (fmt, dtype, params, _) in RECIPES.items():
            gen = torch.Generator(device="cuda").manual_seed(0)
            def make():
                return from_planes(fmt, dtype, params, (N, K), random_planes(fmt, params, (N, K), K ** -0.5, gen,
                                                                             "cuda"), False)
            one = make()
            ws = [one] + [make() for _ in range(max(2, ROTATE_BYTES // one.nbytes) - 1)]
            best = None
            # the sweep at M = 1 only: at 8 rows the heuristic's wider tiles are the point
            for cfg in [None] + (SWEEP if M == 1 else []):
                kw = {} if cfg is None else dict(bw=cfg[0], num_stages=cfg[1], num_warps=cfg[2], use_dot=cfg[3])
                try:
                    us = graph_us(lambda: qgemv(x, ws[next(it) % len(ws)], **kw), 2 * len(ws))
                except Exception as exc:  # noqa: BLE001 - a configuration that does not compile is skipped
                    print(f"  {recipe} {cfg}: {type(exc).__name__}")
                    continue
                row[f"{recipe}_{'default' if cfg is None else 'x'.join(map(str, cfg))}_us"] = us
                if best is None or us < best[0]:
                    best = (us, cfg)
            row[f"{recipe}_default_tb_s"] = one.nbytes / row.get(f"{recipe}_default_us", float("nan")) / 1e6
            best = best or (float("nan"), None)
            row[f"{recipe}_best"] = {"us": best[0], "config": best[1], "tb_s": one.nbytes / best[0] / 1e6}
        results.append(row)
        print(f"{name:14} M={M} N={N:6} K={K:6} bf16 {bf16:7.1f} us | " + " | ".join(
            f"{r} {row.get(f'{r}_default_us', float('nan')):6.1f} us ({row[f'{r}_default_tb_s']:.2f} TB/s) "
            f"best {row[f'{r}_best']['us']:6.1f} {row[f'{r}_best']['config']}" for r in RECIPES), flush=True)
    del dense
    torch.cuda.empty_cache()


def _cuda_us(fn, iters: int = 10) -> float:
    """Microseconds per back-to-back call on the device timeline (the prefill GEMMs are long enough not to need the
    graph the GEMV cases are timed in)."""
    return cuda_ms(fn, iters) * 1e3


def _scaled_mm_variants(xq, xs, w):
    """torch._scaled_mm with 1x128 activation and 128x128 weight scales, in the scale layouts cuBLAS may want."""
    ws = w.scales
    pad = (-ws.shape[1]) % 4
    ws4 = torch.nn.functional.pad(ws, (0, pad)) if pad else ws
    return {"a_outer_b_t": lambda: torch._scaled_mm(xq, w.data.t(), xs.t().contiguous().t(), ws.t(),
                                                    out_dtype=torch.bfloat16),
            "a_outer_b_pad4_t": lambda: torch._scaled_mm(xq, w.data.t(), xs.t().contiguous().t(), ws4.t(),
                                                         out_dtype=torch.bfloat16),
            "a_row_b_t": lambda: torch._scaled_mm(xq, w.data.t(), xs, ws.t().contiguous(),
                                                  out_dtype=torch.bfloat16)}


def bench_gemm(model: str, M: int, results: list) -> None:
    """Prefill GEMMs at M rows: bf16 cuBLAS, the A8 Triton fp8_gemm (and its activation quantization alone),
    dequantize-then-cuBLAS for each recipe, and torch._scaled_mm's blockwise FP8 where this torch has it."""
    from ninfer.fast.ops.fp8_gemm.triton import fp8_gemm, quantize_rows_fp8
    from ninfer.fast.ops.qlinear.naive import qlinear_a8_naive
    from ninfer.fast.ops.qlinear.triton import qlinear
    for name, N, K in shapes(model):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        dense = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
        flops = 2 * M * N * K
        row = {"shape": f"{model}.{name}", "M": M, "N": N, "K": K, "bf16_us": _cuda_us(lambda: F.linear(x, dense))}
        del dense
        for recipe, (fmt, dtype, params, _) in RECIPES.items():
            gen = torch.Generator(device="cuda").manual_seed(0)
            w = from_planes(fmt, dtype, params, (N, K), random_planes(fmt, params, (N, K), K ** -0.5, gen, "cuda"),
                            recipe == "fp8")
            row[f"{recipe}_dequant_gemm_us"] = _cuda_us(lambda: qlinear(x, w))
            if recipe != "fp8":
                continue
            row["fp8_gemm_us"] = _cuda_us(lambda: fp8_gemm(x, w))
            row["fp8_quant_us"] = _cuda_us(lambda: quantize_rows_fp8(x, 128))
            xq, xs = quantize_rows_fp8(x[:256], 128)
            ref = qlinear_a8_naive(x[:256].float(), w).float()
            got = fp8_gemm(x[:256], w).float()
            row["fp8_gemm_rel_err"] = ((got - ref).norm() / ref.norm()).item()
            xq, xs = quantize_rows_fp8(x, 128)
            for v, fn in _scaled_mm_variants(xq, xs, w).items():
                try:
                    out = fn()[:256].float()
                    row[f"scaled_mm_{v}_rel_err"] = ((out - ref).norm() / ref.norm()).item()
                    row[f"scaled_mm_{v}_us"] = _cuda_us(fn)
                except Exception as exc:  # noqa: BLE001 - this torch/cuBLAS may lack the recipe or layout
                    row[f"scaled_mm_{v}"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        results.append(row)
        print(f"{row['shape']:16} M={M} N={N} K={K}: bf16 {row['bf16_us']:.0f} us ({flops / row['bf16_us'] / 1e6:.0f}"
              f" TFLOP/s) | " + " | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in row.items() if k not in ("shape", "M", "N", "K", "bf16_us")),
              flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="9B")
    ap.add_argument("--shapes", default=None, help="comma-separated projection names (default: all)")
    ap.add_argument("--gemm", type=int, default=0, help="instead: the prefill GEMMs at this many rows")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    results: list = []
    for model in args.models.split(",") if args.gemm else ():
        bench_gemm(model, args.gemm, results)
    for model in () if args.gemm else args.models.split(","):
        for name, N, K in shapes(model):
            if args.shapes is None or name in args.shapes.split(","):
                bench_shape(f"{model}.{name}", N, K, results)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_qgemv.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
