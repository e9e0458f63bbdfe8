"""Decode GEMV micro-benchmark: cuBLAS (``F.linear``) against ninfer's ``gemv`` on every decode projection of the
Qwen3.5 shapes, at M = 1 and 8 rows, random bf16 weights.

Each implementation is timed inside a CUDA graph of back-to-back calls (as in a captured decode step) that cycles
through enough weight copies to exceed the L2 cache, so every call streams its weight from HBM as a real layer
does. Printed per shape: us per call and achieved TB/s (weight bytes / time) of both, a verdict, and how many
calls a decode step makes (so the step total can be read off). gate_up rows also time the fused SwiGLU form
against cuBLAS followed by the swiglu kernel. The decode layer's fusions are timed beside them: an input
projection (in_proj, qkv, gate_up, router) as RMSNorm + cuBLAS against the GEMV with the norm in its prologue, an
output projection (out_proj, o_proj, down) as cuBLAS against the GEMV adding the residual in place: the
measurements behind ``_norm_gemv_wins`` and ``_residual_gemv_wins`` (ninfer/fast/model/kernels.py). At M = 1 the GEMV's
dot-free one-row form (``gemv.triton.ONE_ROW = "fma"``, opt-in) is timed too. ``--sweep`` adds a few alternative kernel configurations per shape
and names the fastest, to retune ``pick_config``; ``--lm-head`` adds the [V, H] lm_head (2 GB on 9B).

Run: python benchmarks/gpu/bench_gemv.py [--models 0.8B,9B,35B-A3B] [--sweep] [--lm-head]   # ~20-30 s, H200
     python benchmarks/gpu/bench_gemv.py --smoke   # the same code paths on a CPU (Triton interpreter, tiny shapes)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

# the interpreter must be chosen before triton is first imported
if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shapes import config  # noqa: E402

from ninfer.fast.ops.gemv import GemvConfig, gemv, gemv_swiglu, pick_config  # noqa: E402
from ninfer.fast.ops.gemv import triton as gemv_triton  # noqa: E402
from ninfer.fast.ops.rmsnorm import rmsnorm  # noqa: E402
from ninfer.fast.ops.swiglu import swiglu  # noqa: E402

ROWS = (1, 8)
# total bytes of the rotating weight copies: over the H200's 50 MB L2
ROTATE_BYTES = 256 << 20


@dataclass(frozen=True)
class Shape:
    name: str
    K: int
    N: int
    per_step: int  # calls in one decode step
    fused: bool = False  # gate_up [gate | up], followed by SwiGLU
    role: str = "in"  # "in": reads the normed residual stream; "out": adds to it


def decode_shapes(model: str, lm_head: bool) -> list[Shape]:
    cfg = config(model)
    H, n_gdn, n_attn, L = cfg.hidden_size, len(cfg.linear_layers), len(cfg.attention_layers), cfg.num_hidden_layers
    q_rows = cfg.num_attention_heads * cfg.head_dim
    shapes = [Shape("in_proj", H, cfg.conv_dim + cfg.linear_value_dim + 2 * cfg.linear_num_value_heads, n_gdn),
              Shape("out_proj", cfg.linear_value_dim, H, n_gdn, role="out"),
              Shape("qkv", H, 2 * q_rows + 2 * cfg.num_key_value_heads * cfg.head_dim, n_attn),
              Shape("o_proj", q_rows, H, n_attn, role="out")]
    if cfg.is_moe:
        Is = cfg.shared_expert_intermediate_size
        shapes += [Shape("router", H, cfg.num_experts + 1, L), Shape("shared_gate_up", H, 2 * Is, L, True),
                   Shape("shared_down", Is, H, L, role="out")]
    else:
        I = cfg.intermediate_size
        shapes += [Shape("gate_up", H, 2 * I, L, True), Shape("down", I, H, L, role="out")]
    if lm_head:
        shapes.append(Shape("lm_head", H, cfg.vocab_size, 1))
    return shapes


def time_us(fn, weights: list[torch.Tensor], reps: int) -> float:
    """Microseconds per call of fn(w), w cycling through ``weights``: graph replays on the GPU, wall time on CPU."""
    if not torch.cuda.is_available():
        t = time.perf_counter()
        for w in weights:
            fn(w)
        return (time.perf_counter() - t) * 1e6 / len(weights)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # compiles the kernel, creates the cuBLAS handle and the split-K counters before capture
        for w in weights[:2]:
            fn(w)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            fn(w)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * len(weights))


def sweep_configs(M: int, s: Shape, num_sms: int) -> list[GemvConfig]:
    rows = s.N
    out = []
    for bw in (16, 32, 64):
        auto = pick_config(M, rows, s.K, 2, num_sms, bw=bw)
        out += [auto, GemvConfig(bw, auto.bk, 1)] if auto.splits > 1 else [auto]
    return out + [GemvConfig(16, 512, 1, num_warps=4, num_stages=3), GemvConfig(32, 128, 1, num_warps=4, num_stages=6)]


def verdict(cublas: float, ours: float) -> str:
    r = cublas / ours
    return f"ours x{r:.2f}" if r >= 1.05 else (f"cuBLAS (ours x{r:.2f})" if r <= 0.95 else f"tie (x{r:.2f})")


def bench_shape(s: Shape, M: int, dev: str, sweep: bool, num_sms: int) -> dict:
    nbytes = s.N * s.K * 2
    copies = max(2, min(64, -(-ROTATE_BYTES // nbytes))) if dev == "cuda" else 2
    weights = [torch.randn(s.N, s.K, device=dev, dtype=torch.bfloat16) * s.K ** -0.5 for _ in range(copies)]
    x = torch.randn(M, s.K, device=dev, dtype=torch.bfloat16)
    reps = max(3, min(50, int(2e9 / (nbytes * copies)))) if dev == "cuda" else 1
    r = {"shape": s.name, "K": s.K, "N": s.N, "M": M, "per_step": s.per_step, "mb": nbytes / 1e6,
         "cublas_us": time_us(lambda w: F.linear(x, w), weights, reps),
         "ours_us": time_us(lambda w: gemv(x, w), weights, reps),
         "config": asdict(pick_config(M, s.N, s.K, 2, num_sms))}
    if s.fused:
        r["cublas_swiglu_us"] = time_us(lambda w: swiglu(F.linear(x, w)), weights, reps)
        r["fused_us"] = time_us(lambda w: gemv_swiglu(x, w), weights, reps)
    r.update(bench_fusion(s, x, weights, reps))
    if M == 1:
        r.update(bench_fma(s, x, weights, reps))
    if sweep:
        timed = [(time_us(lambda w: gemv(x, w, config=c), weights, reps), c) for c in sweep_configs(M, s, num_sms)]
        best_us, best = min(timed, key=lambda t: t[0])
        r["best_us"], r["best_config"] = best_us, asdict(best)
    return r


def bench_fma(s: Shape, x: torch.Tensor, weights: list[torch.Tensor], reps: int) -> dict:
    """The dot-free one-row form (``gemv.triton.ONE_ROW = "fma"``): the plain GEMV and, on gate_up, its SwiGLU form,
    beside the tl.dot form's numbers above."""
    saved, gemv_triton.ONE_ROW = gemv_triton.ONE_ROW, "fma"
    try:
        r = {"fma_us": time_us(lambda w: gemv(x, w), weights, reps)}
        if s.fused:
            r["fma_fused_us"] = time_us(lambda w: gemv_swiglu(x, w), weights, reps)
        return r
    finally:
        gemv_triton.ONE_ROW = saved


def bench_fusion(s: Shape, x: torch.Tensor, weights: list[torch.Tensor], reps: int) -> dict:
    """The decode layer's fused forms against their unfused pairs (an input projection's norm; an output
    projection's residual add, which unfused rides on the next norm and costs the bare cuBLAS call)."""
    if s.role == "out":
        h = torch.randn(x.shape[0], s.N, device=x.device, dtype=x.dtype)
        return {"residual_us": time_us(lambda w: gemv(x, w, out=h, residual=h), weights, reps)}
    nw = torch.randn(s.K, device=x.device, dtype=x.dtype) * 0.1
    if s.fused:
        return {"norm_cublas_us": time_us(lambda w: swiglu(F.linear(rmsnorm(x, nw, 1e-6)[0], w)), weights, reps),
                "norm_fused_us": time_us(lambda w: gemv_swiglu(x, w, norm_weight=nw, eps=1e-6), weights, reps)}
    return {"norm_cublas_us": time_us(lambda w: F.linear(rmsnorm(x, nw, 1e-6)[0], w), weights, reps),
            "norm_fused_us": time_us(lambda w: gemv(x, w, norm_weight=nw, eps=1e-6), weights, reps)}


def _short(c: dict) -> str:
    return f"[bw{c['rows']} bk{c['bk']} s{c['splits']} w{c['num_warps']} st{c['num_stages']}]"


def line(r: dict) -> str:
    tb = lambda us: r["mb"] / us  # MB / us = TB/s  # noqa: E731
    text = (f"{r['shape']:>14} {r['K']:>6}->{r['N']:<7} M={r['M']}  x{r['per_step']:<3} {r['mb']:7.1f} MB  "
            f"cuBLAS {r['cublas_us']:8.2f} us {tb(r['cublas_us']):4.2f} TB/s   "
            f"ours {r['ours_us']:8.2f} us {tb(r['ours_us']):4.2f} TB/s {_short(r['config'])}  "
            f"{verdict(r['cublas_us'], r['ours_us'])}")
    if "fused_us" in r:
        text += (f"\n{'':>14} +swiglu: cuBLAS+swiglu {r['cublas_swiglu_us']:8.2f} us   gemv_swiglu "
                 f"{r['fused_us']:8.2f} us   {verdict(r['cublas_swiglu_us'], r['fused_us'])}")
    if "norm_fused_us" in r:
        text += (f"\n{'':>14} +norm: rmsnorm+cuBLAS {r['norm_cublas_us']:8.2f} us   gemv with norm "
                 f"{r['norm_fused_us']:8.2f} us   {verdict(r['norm_cublas_us'], r['norm_fused_us'])}")
    if "residual_us" in r:
        text += (f"\n{'':>14} +residual: cuBLAS {r['cublas_us']:8.2f} us   gemv adding the residual "
                 f"{r['residual_us']:8.2f} us   {verdict(r['cublas_us'], r['residual_us'])}")
    if "fma_us" in r:
        text += (f"\n{'':>14} dot-free one-row form: {r['fma_us']:8.2f} us {tb(r['fma_us']):4.2f} TB/s   "
                 f"{verdict(r['cublas_us'], r['fma_us'])}" +
                 (f"   +swiglu {r['fma_fused_us']:8.2f} us" if "fma_fused_us" in r else ""))
    if "best_us" in r:
        text += f"\n{'':>14} sweep best {r['best_us']:8.2f} us {tb(r['best_us']):4.2f} TB/s {_short(r['best_config'])}"
    return text


def step_total(rows: list[dict], model: str, M: int) -> str:
    mine = [r for r in rows if r["model"] == model and r["M"] == M and r["shape"] != "lm_head"]
    cub = sum(r["per_step"] * r.get("cublas_swiglu_us", r["cublas_us"]) for r in mine)
    ours = sum(r["per_step"] * r.get("fused_us", r["ours_us"]) for r in mine)
    return f"{model} M={M}: projections per decode step {cub:8.1f} us cuBLAS -> {ours:8.1f} us ours"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="0.8B,9B,35B-A3B")
    ap.add_argument("--sweep", action="store_true", help="also time alternative configs (about twice as long)")
    ap.add_argument("--lm-head", action="store_true", help="also the [V, H] lm_head")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--smoke", action="store_true", help="tiny shape on the CPU through the Triton interpreter")
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    models = ["tiny"] if args.smoke else args.models.split(",")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 132
    if dev == "cuda":
        print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; graphs of back-to-back calls over "
              f"{ROTATE_BYTES >> 20} MB of weight copies")
    rows = []
    t0 = time.perf_counter()
    for model in models:
        print(f"== {model}")
        for s in decode_shapes(model, args.lm_head):
            for M in ROWS:
                r = {"model": model, **bench_shape(s, M, dev, args.sweep, num_sms)}
                rows.append(r)
                print(line(r), flush=True)
            if dev == "cuda":
                torch.cuda.empty_cache()
    print()
    for model in models:
        for M in ROWS:
            print(step_total(rows, model, M))
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_gemv.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
