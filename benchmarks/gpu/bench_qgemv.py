"""Quantized decode GEMV micro-benchmark: ``qgemv`` (FP8 128x128, int4 g128 in the load-time tile order and, as
``q4_generic``, in the stored order through the generic kernel, NVFP4) on the 9B and 35B-A3B decode projections at
M = 1 and 8, beside the bf16 ``gemv``/cuBLAS on the same shape, with a sweep of kernel configurations (weight rows
per program, stages, warps, tl.dot or dot-free, splits) to tune the heuristic; ``fp8row``: the FP8 weights at M = 1
through the one-row "row" form (with and without PDL), ``fp8`` at M = 1 through the tl.dot form; ``fp8rows``: at M = 2
and 4 through the few-rows "rows" form (`fastgemv.FP8_ROWS`), ``fp8`` beside it at those M through tl.dot and ``q4``
through tl.dot and (in its sweep) dot-free.

Each case is timed inside a CUDA graph of back-to-back calls cycling through weight copies larger than the L2
cache, so every call streams its weight from HBM. Printed: us per call and GB/s of the bytes really stored, and the
speed-up over bf16. ``--smoke`` runs every case once on the CPU (interpreter, tiny shape) and checks it against
``qlinear_naive``: CI runs it (tests/benchmarks/test_gpu_scripts_smoke.py).

``--gemm M`` times the prefill side instead: per projection at M rows, bf16 cuBLAS, the A8 ``fp8_gemm`` (and its
activation quantization alone), dequantize-then-cuBLAS per recipe, and ``torch._scaled_mm``'s blockwise FP8 (1x128
activations x 128x128 weights) in the scale layouts cuBLAS may take, each with its error against the naive A8.

Run: python benchmarks/gpu/bench_qgemv.py [--models 9B,35B-A3B] [--shapes ...] [--variants fp8,fp8row]
[--gemm 8192] [--out DIR] [--smoke]
(or ``bash benchmarks/gpu/run.sh qgemv``)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import cuda_ms, graph_us  # noqa: E402
from quant_weights import RECIPES, random_planes  # noqa: E402
from shapes import config  # noqa: E402

from ninfer.fast.ops import pdl  # noqa: E402
from ninfer.fast.ops.gemv import gemv  # noqa: E402
from ninfer.fast.ops.qlinear import fastgemv, from_planes, qlinear_naive  # noqa: E402
from ninfer.fast.ops.qlinear.fastgemv import to_tiles  # noqa: E402
from ninfer.fast.ops.qlinear.triton import qgemv  # noqa: E402

ROTATE_BYTES = 256 << 20
# per (recipe, M = 1 or more): (rows per program, stages, warps, tl.dot, splits or None for the heuristic[, FP8's K
# tile])
SWEEP = {
    ("q4", 1): [(64, 4, 4, False, None), (128, 4, 4, False, None), (128, 2, 4, False, None), (128, 3, 8, False, None),
                (256, 3, 8, False, None), (128, 4, 4, False, 16), (64, 4, 4, True, None)],
    ("q4", 8): [(32, 4, 4, True, None), (64, 4, 4, True, None), (64, 3, 8, True, None), (128, 3, 8, True, None),
                (32, 4, 4, False, None)],
    ("fp8", 1): [(32, 4, 4, False, None), (64, 4, 4, False, None), (16, 4, 4, False, None), (64, 3, 8, False, None),
                 (32, 4, 4, True, None), (16, 4, 4, True, None),
                 # K tiles over 2..8 column blocks: more bytes in flight per program
                 (32, 4, 4, False, None, 256), (16, 4, 4, False, None, 256), (16, 4, 4, False, None, 512),
                 (16, 3, 8, False, None, 512), (8, 4, 4, False, None, 512), (8, 3, 4, False, None, 1024),
                 (16, 2, 8, False, None, 1024), (32, 3, 8, False, None, 512)],
    ("fp8", 8): [(32, 4, 4, True, None), (64, 4, 4, True, None), (64, 3, 8, True, None), (32, 4, 4, False, None)],
    ("nvfp4", 1): [(32, 4, 4, True, None), (64, 3, 8, True, None), (32, 4, 4, False, None)],
    ("nvfp4", 8): [(32, 4, 4, True, None), (64, 3, 8, True, None)],
    # FP8's one-row "row" form (`fp8_row`): (rows, stages, warps, form, splits), form "" or "pdl" (programmatic
    # dependent launch, `ninfer.fast.ops.pdl.ENABLED`)
    ("fp8row", 1): [(64, 4, 4, "", None), (64, 4, 4, "pdl", None), (128, 4, 8, "", None), (128, 4, 8, "pdl", None),
                    (32, 4, 4, "", None), (64, 4, 4, "", 2), (64, 4, 4, "", 4), (128, 4, 8, "", 2),
                    (128, 4, 4, "", None), (256, 4, 8, "", None)],
    # FP8's few-rows "rows" form (`fp8_rows`) at M = 2 and 4: (rows, stages, warps, "", splits)
    ("fp8rows", 8): [(64, 4, 4, "", None), (32, 4, 4, "", None), (128, 4, 8, "", None), (64, 3, 4, "", None),
                     (64, 4, 4, "", 2)],
}
# q4_generic: int4 in the stored order, the generic kernel; fp8row: the FP8 weights through the one-row "row" form;
# fp8rows: through the few-rows form, at M = 2 and 4 (where "fp8" runs its tl.dot form beside it, and "q4" its
# tl.dot and, in the sweep, dot-free forms)
VARIANTS = ["fp8", "q4", "q4_generic", "nvfp4", "fp8row", "fp8rows"]
ROWS_FORM_M = (2, 4)


def shapes(model: str) -> list[tuple[str, int, int]]:
    if model == "tiny":
        return [("tiny", 40, 256)]
    cfg = config(model)
    H = cfg.hidden_size
    q = cfg.num_attention_heads * cfg.head_dim
    out = [("in_proj_qkvz", cfg.conv_dim + cfg.linear_value_dim, H), ("out_proj", H, cfg.linear_value_dim),
           ("qkv", 2 * q + 2 * cfg.num_key_value_heads * cfg.head_dim, H), ("o_proj", H, q)]
    if not cfg.is_moe:
        out += [("gate_up", 2 * cfg.intermediate_size, H), ("down", H, cfg.intermediate_size)]
    return out


def _weights(variant: str, N: int, K: int, device: str, smoke: bool) -> list:
    """Copies of one random weight in the variant's device layout, together past the L2 cache (one on the CPU)."""
    fmt, dtype, params, _ = RECIPES[{"q4_generic": "q4", "fp8row": "fp8", "fp8rows": "fp8"}.get(variant, variant)]
    gen = torch.Generator(device=device).manual_seed(0)

    def make():
        w = from_planes(fmt, dtype, params, (N, K), random_planes(fmt, params, (N, K), K ** -0.5, gen, device), False)
        return to_tiles(w) if variant == "q4" else w
    one = make()
    return [one] if smoke else [one] + [make() for _ in range(max(2, ROTATE_BYTES // one.nbytes) - 1)]


def _sweep(variant: str, M: int, smoke: bool) -> list:
    if variant == "q4_generic":
        return [None]
    configs = SWEEP.get((variant, 1 if M == 1 else 8), [])
    # the smoke run checks the first two and the first wide FP8 tile against the naive op
    return [None] + (configs[:2] + [c for c in configs if len(c) > 5][:1] if smoke else configs)


def _config_name(cfg) -> str:
    if cfg is None:
        return "default"
    bw, stages, warps, dot, splits = cfg[:5]
    form = dot if isinstance(dot, str) else "dot" if dot else "fma"
    return f"{bw}r{stages}s{warps}w{form}" + (f"{splits}k" if splits else "") + \
        (f"{cfg[5]}bk" if len(cfg) > 5 else "")


@contextlib.contextmanager
def _form(variant: str, cfg):
    """fastgemv's module switches for the variant and configuration (fp8: the tl.dot form at one row; fp8row: the
    row form, with PDL where the configuration asks; fp8rows: the few-rows form)."""
    saved = fastgemv.FP8_ONE_ROW, pdl.ENABLED, fastgemv.FP8_ROWS
    if variant in ("fp8", "fp8row"):
        fastgemv.FP8_ONE_ROW = "row" if variant == "fp8row" else "dot"
        pdl.ENABLED = variant == "fp8row" and (saved[1] if cfg is None else cfg[3] == "pdl")
    fastgemv.FP8_ROWS = variant == "fp8rows"
    try:
        yield
    finally:
        fastgemv.FP8_ONE_ROW, pdl.ENABLED, fastgemv.FP8_ROWS = saved


def _runs_at(variant: str, M: int) -> bool:
    """Which variants a row count times: at M = 2 and 4 the few-rows form with "fp8" (tl.dot) and "q4" (tl.dot,
    its sweep dot-free too) beside it; at 1 and 8 the rest, the one-row form at 1 alone."""
    if M in ROWS_FORM_M:
        return variant in ("fp8", "q4", "fp8rows")
    return variant != "fp8rows" and (variant != "fp8row" or M == 1)


def _time_variant(variant: str, x, ws: list, M: int, smoke: bool, row: dict, errors: dict) -> None:
    if not _runs_at(variant, M):
        return
    it = iter(range(1 << 30))
    nbytes = ws[0].nbytes
    best = None
    for cfg in _sweep(variant, M, smoke):
        kw = {} if cfg is None else dict(bw=cfg[0], num_stages=cfg[1], num_warps=cfg[2], splits=cfg[4])
        if cfg is not None and variant not in ("fp8row", "fp8rows"):
            kw.update(use_dot=cfg[3], bk=cfg[5] if len(cfg) > 5 else None)
        name = _config_name(cfg)
        try:
            with _form(variant, cfg):
                us = graph_us(lambda: qgemv(x, ws[next(it) % len(ws)], **kw), 2 * len(ws))
                if smoke:
                    ref = qlinear_naive(x, ws[0]).float()
                    err = ((qgemv(x, ws[0], **kw).float() - ref).norm() / ref.norm()).item()
                    if not err < 1e-4:
                        errors[f"{row['shape']} M={M} {variant} {name}"] = f"relative error {err:.3g}"
        except Exception as exc:  # noqa: BLE001 - a configuration that does not compile is reported and skipped
            print(f"  {variant} {name}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        row[f"{variant}_{name}_us"] = us
        if best is None or us < best[0]:
            best = (us, name)
    if best is None:
        errors[f"{row['shape']} M={M} {variant}"] = "no configuration ran"
        return
    default = row.get(f"{variant}_default_us", float("nan"))
    row[f"{variant}_bytes"] = nbytes
    row[f"{variant}_default_gb_s"] = nbytes / default / 1e3
    row[f"{variant}_best"] = {"us": best[0], "config": best[1], "gb_s": nbytes / best[0] / 1e3,
                              "speedup_vs_bf16": row["bf16_us"] / best[0]}


def bench_shape(name: str, N: int, K: int, results: list, errors: dict, smoke: bool,
                variants: list[str] = VARIANTS) -> None:
    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.bfloat16
    copies = 1 if smoke else max(2, ROTATE_BYTES // (N * K * 2))
    dense = [torch.randn(N, K, device=device, dtype=dtype) * K ** -0.5 for _ in range(copies)]
    weights = {v: _weights(v, N, K, device, smoke) for v in variants}
    for M in (1, *(ROWS_FORM_M if "fp8rows" in variants else ()), 8):
        x = torch.randn(M, K, device=device, dtype=dtype)
        it = iter(range(1 << 30))
        bf16 = min(graph_us(lambda: F.linear(x, dense[next(it) % len(dense)]), 2 * len(dense)),
                   graph_us(lambda: gemv(x, dense[next(it) % len(dense)]), 2 * len(dense)))
        row = {"shape": name, "N": N, "K": K, "M": M, "bf16_us": bf16, "bf16_gb_s": N * K * 2 / bf16 / 1e3}
        for variant in variants:
            _time_variant(variant, x, weights[variant], M, smoke, row, errors)
        results.append(row)
        print(f"{name:14} M={M} N={N:6} K={K:6} bf16 {bf16:7.1f} us {row['bf16_gb_s']:5.0f} GB/s | " + " | ".join(
            f"{v} {row.get(f'{v}_default_us', float('nan')):6.1f} us ({row.get(f'{v}_default_gb_s', 0):5.0f} GB/s)"
            f" best {row[f'{v}_best']['us']:6.1f} {row[f'{v}_best']['config']} "
            f"x{row[f'{v}_best']['speedup_vs_bf16']:.2f}" for v in variants if f"{v}_best" in row), flush=True)
    del dense, weights
    if not smoke:
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
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (default: all)")
    ap.add_argument("--gemm", type=int, default=0, help="instead: the prefill GEMMs at this many rows")
    ap.add_argument("--smoke", action="store_true", help="CPU: the interpreter on a tiny shape, results checked")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    results: list = []
    errors: dict = {}
    models = ["tiny"] if args.smoke else args.models.split(",")
    for model in models if args.gemm and not args.smoke else ():
        bench_gemm(model, args.gemm, results)
    for model in () if args.gemm and not args.smoke else models:
        for name, N, K in shapes(model):
            if args.shapes is None or name in args.shapes.split(","):
                bench_shape(f"{model}.{name}", N, K, results, errors, args.smoke, args.variants.split(","))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_qgemv.json"), "w") as f:
            json.dump({"rows": results, "errors": errors, "skipped": []}, f, indent=1, default=str)
    for key, why in errors.items():
        print(f"ERROR {key}: {why}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
