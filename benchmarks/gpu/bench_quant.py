"""Quantized weights through the public Engine on the fast Program (issue 13), beside bf16 in the same run: per
model (9B, 35B-A3B) and recipe (bf16, fp8 = FP8 128x128 blocks with A8 prefill, q4 = int4 g128, nvfp4), decode ms
per token at B = 1, 2, 4, 8 (512-token contexts) against the bandwidth floor of the bytes really stored, and time
to first token at 2048 / 8192 tokens; the issue's targets with pass/fail at the end.

Weights are random planes made on the device (quant_weights.py; shapes.py for the dense ones), so the numbers are
speed only. A recipe "fp8:dot", "fp8:vector" or "fp8:row" picks FP8's one-row GEMV form
(`fastgemv.FP8_ONE_ROW`), "fp8:f16" its tl.dot form's operand type (`fastgemv.FP8_F16_DOT`; forms combine:
"fp8:row+f16"); "pdl" / "nopdl" launch the decode path's Triton kernels with or without programmatic dependent
launch (`ninfer.fast.ops.pdl.ENABLED`; "bf16:nopdl" too);
"fp8:qmoe" runs FP8 expert stacks through `qmoe`'s per-pair GEMVs instead of the fused `moe_decode`
(`kernels.FP8_MOE_DECODE` off); "fp8:rows" runs 2..4 rows through the few-rows form (`fastgemv.FP8_ROWS`);
"bf16:fma", "bf16:allgemv", "bf16:fused" (combinable: "bf16:fma+allgemv+fused") run the dense GEMV's dot-free
one-row form, every dense decode projection through the GEMV, the "triton-fused" op table.
Run: python benchmarks/gpu/bench_quant.py [--models 9B,35B-A3B] [--recipes bf16,fp8,q4,nvfp4]
[--deadline-s 290] [--out DIR];  --smoke runs the same code on a CPU (tiny shape, naive kernels).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_engine as be  # noqa: E402
from engine_report import fmt  # noqa: E402
from measure import decode_floor, hbm_bandwidth  # noqa: E402
from quant_weights import random_quant  # noqa: E402
from runlog import Run, bench_arguments, close, free_device, print_problems  # noqa: E402
from shapes import config, random_source  # noqa: E402

from ninfer.engine.config import EngineConfig  # noqa: E402
from ninfer.engine.engine import Engine  # noqa: E402
from ninfer.fast.memory import device_budget  # noqa: E402
from ninfer.fast.model import kernels  # noqa: E402
from ninfer.fast.ops import pdl  # noqa: E402
from ninfer.fast.ops.gemv import triton as gemv_triton  # noqa: E402
from ninfer.fast.ops.qlinear import QuantWeight, fastgemv  # noqa: E402
from ninfer.fast.program import FastProgram, FastProgramConfig  # noqa: E402

SETTINGS = dataclasses.replace(be.Settings(), contexts=(512,), decode_tokens=32, long_context=16384)
SMOKE = dataclasses.replace(be.SMOKE, contexts=(16,), prefill=(64,))
# (model, recipe, metric, bound): decode ms/token at B=1 at most bound; prefill 8192 speed-up over bf16 at least
TARGETS = [("9B", "fp8", "decode_ms_b1", 2.4), ("9B", "q4", "decode_ms_b1", 1.6),
           ("35B-A3B", "fp8", "decode_ms_b1", 2.0), ("9B", "fp8", "prefill_8192_speedup", 1.4)]
MIN_SECONDS = {"9B": 35, "35B-A3B": 50, "tiny": 1}


def weight_read_bytes(program: FastProgram, batch: int) -> int:
    """Stored bytes one decode step streams: every resident weight but the embedding (B rows of it), and of each
    MoE layer's routed experts at most min(E, B*k)."""
    cfg, w = program.model.cfg, program.model.weights
    total = w.nbytes - w.embed.numel() * w.embed.element_size() * (w.lm_head is not w.embed)
    if cfg.is_moe:
        E, k = cfg.num_experts, cfg.num_experts_per_tok
        for lw in w.layers:
            stacks = (lw.ffn.experts_gate_up, lw.ffn.experts_down)
            per = sum(s.nbytes if isinstance(s, QuantWeight) else s.numel() * s.element_size() for s in stacks) / E
            total -= int(per * (E - min(E, batch * k)))
    return total


def build(run: Run, name: str, recipe: str) -> tuple[FastProgram, Engine, dict]:
    s, cfg = run.s, config(name)
    if s.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t = time.monotonic()
    settings = FastProgramConfig(max_concurrency=be.LANES, max_context=s.max_context, checkpoint_slots=8,
                                 max_prefill_tokens=s.prefill_chunk)
    budget = s.budget_bytes if s.budget_bytes is not None else device_budget(0.9)
    quant = None if recipe == "bf16" else random_quant(cfg, s.device, recipe, small=s.device != "cuda")
    program = FastProgram.build(cfg, random_source(cfg, s.device), settings, budget_bytes=budget, device=s.device,
                                kernels=s.kernels, quant=quant)
    # as served (`ninfer serve` runs the fast Program with async scheduling), like bench_engine.py
    overlap = os.environ.get("NINFER_BENCH_ASYNC", "1") != "0"
    engine = Engine(program, EngineConfig(max_concurrency=be.LANES, prefill_chunk=s.prefill_chunk,
                                          async_scheduling=overlap), threaded=False)
    plan = program.model.plan
    info = {"build_s": time.monotonic() - t, "weight_bytes": program.model.weights.nbytes,
            "formats": program.model.weights.formats(), "kv_bytes": plan.kv_bytes, "kv_pages": plan.num_pages}
    return program, engine, info


def bench_one(run: Run, name: str, recipe: str) -> None:
    """One recipe; after the colon, forms joined by "+": "dot" / "vector" / "row" run FP8's one-row GEMV in that
    form (`fastgemv.FP8_ONE_ROW`), "f16" its tl.dot form with f16 operands (`fastgemv.FP8_F16_DOT`), "pdl" /
    "nopdl" the decode kernels with or without PDL (`ninfer.fast.ops.pdl.ENABLED`: every Triton kernel that takes
    it), "qmoe" its expert stacks through `qmoe` (`kernels.FP8_MOE_DECODE` off), "rows" FP8 at 2..4 rows through
    the few-rows form (`fastgemv.FP8_ROWS`), "fma" the dense GEMV's dot-free one-row form (`gemv.triton.ONE_ROW`),
    "allgemv" every dense decode projection through the GEMV (`kernels.GEMV_EVERY_PROJECTION`), "fused" the
    "triton-fused" op table, each set for this build and its graphs."""
    base, _, form = recipe.partition(":")
    forms = set(form.split("+")) if form else set()
    saved = (fastgemv.FP8_ONE_ROW, fastgemv.FP8_F16_DOT, pdl.ENABLED, kernels.FP8_MOE_DECODE, fastgemv.FP8_ROWS,
             gemv_triton.ONE_ROW, kernels.GEMV_EVERY_PROJECTION, run.s)
    for one_row in forms & {"dot", "vector", "row"}:
        fastgemv.FP8_ONE_ROW = one_row
    fastgemv.FP8_F16_DOT = saved[1] or "f16" in forms
    pdl.ENABLED = (saved[2] or "pdl" in forms) and "nopdl" not in forms
    kernels.FP8_MOE_DECODE = saved[3] and "qmoe" not in forms
    fastgemv.FP8_ROWS = saved[4] or "rows" in forms
    gemv_triton.ONE_ROW = "fma" if "fma" in forms else saved[5]
    kernels.GEMV_EVERY_PROJECTION = saved[6] or "allgemv" in forms
    if "fused" in forms and run.s.device == "cuda":
        run.s = dataclasses.replace(run.s, kernels="triton-fused")
    try:
        _bench(run, name, recipe, base)
    finally:
        (fastgemv.FP8_ONE_ROW, fastgemv.FP8_F16_DOT, pdl.ENABLED, kernels.FP8_MOE_DECODE, fastgemv.FP8_ROWS,
         gemv_triton.ONE_ROW, kernels.GEMV_EVERY_PROJECTION, run.s) = saved


def _bench(run: Run, name: str, recipe: str, base: str) -> None:
    entry = run.results["models"].setdefault(name, {}).setdefault(recipe, {})
    program, engine, info = build(run, name, base)
    entry.update(info)
    try:
        vocab = program.limits.vocab_size
        run.part(f"{name} {recipe} decode", be.bench_decode, run, engine, vocab, entry)
        run.part(f"{name} {recipe} prefill", be.bench_prefill, run, engine, vocab, entry)
        bw = run.results.get("bandwidth", {}).get("copy_tb_s", 0.0)
        for d in entry.get("decode", []):
            f = decode_floor(program.model.cfg, d["B"], d["ctx"], bw)
            moved = weight_read_bytes(program, d["B"]) + f["kv_bytes"] + f["state_bytes"]
            d["floor_ms"] = moved / (bw * 1e9) if bw > 0 else float("nan")
            d["bytes"] = moved
        program.check_invariants()
    finally:
        close(program, engine)
        del program, engine  # in this frame: free_device can release the pools only once nothing holds them
        free_device(run.s.device)


def bench_model(run: Run, name: str, recipes: list[str]) -> None:
    for recipe in recipes:
        if run.left() < MIN_SECONDS.get(name, 40):
            run.results["skipped"].append(f"{name} {recipe} (deadline: {run.left():.0f}s left)")
            continue
        run.part(f"{name} {recipe}", bench_one, run, name, recipe)


def targets(r: dict) -> list[dict]:
    out = []
    for model, recipe, metric, bound in TARGETS:
        m = r.get("models", {}).get(model, {})
        value = None
        if metric == "decode_ms_b1":
            value = next((d["step_ms"] for d in m.get(recipe, {}).get("decode", []) if d["B"] == 1), None)
            ok = value is not None and value <= bound
        else:
            tok = {rc: next((p["tok_s"] for p in m.get(rc, {}).get("prefill", []) if p["T"] == 8192), None)
                   for rc in (recipe, "bf16")}
            value = tok[recipe] / tok["bf16"] if None not in tok.values() else None
            ok = value is not None and value >= bound
        out.append({"model": model, "recipe": recipe, "metric": metric, "bound": bound, "value": value,
                    "result": "not run" if value is None else ("pass" if ok else "FAIL")})
    return out


def print_table(r: dict) -> None:
    print("\n" + "=" * 100)
    bw = r.get("bandwidth", {}).get("copy_tb_s")
    print(f"quantized weights through the Engine on {r.get('device')}, random weights, copy bandwidth "
          f"{fmt(bw)} TB/s; wall {fmt(r.get('wall_s'), '{:.0f}')} s")
    print(f"{'model':8} {'recipe':6} {'weights GiB':>11} {'B':>2} {'ms/step':>8} {'floor ms':>8} {'of floor':>8} "
          f"{'tok/s':>7}")
    for name, recipes in r.get("models", {}).items():
        for recipe, m in recipes.items():
            gib = (m.get("weight_bytes") or 0) / 2**30
            for d in m.get("decode", []):
                frac = d["floor_ms"] / d["step_ms"] if math.isfinite(d.get("floor_ms", math.nan)) else None
                print(f"{name:8} {recipe:6} {gib:11.2f} {d['B']:>2} {d['step_ms']:8.3f} "
                      f"{fmt(d.get('floor_ms'), '{:8.3f}')} {fmt(frac, '{:8.0%}')} {d['tok_s']:7.0f}")
            for p in m.get("prefill", []):
                print(f"  {name:8} {recipe:6} prefill T={p['T']:>5}: TTFT {p['ttft_ms']:8.1f} ms "
                      f"{p['tok_s']:>8.0f} tok/s")
    for t in r.get("targets", []):
        v = "-" if t["value"] is None else f"{t['value']:.3f}"
        op = "<=" if t["metric"].startswith("decode") else ">="
        print(f"TARGET {t['model']} {t['recipe']} {t['metric']} {op} {t['bound']}: {v} -> {t['result']}")
    print_problems(r)


def main() -> int:
    ap = bench_arguments(290.0, "tiny shape on the CPU with the naive kernels")
    ap.add_argument("--recipes", default="bf16,fp8,q4,nvfp4")
    args = ap.parse_args()
    run = Run(args.deadline_s, args.out, SMOKE if args.smoke else SETTINGS, "bench_quant.json")
    if not run.need_cuda(args.smoke, print_table):
        return 1
    if not args.smoke:
        run.results["bandwidth"] = run.part("bandwidth", hbm_bandwidth) or {}
    models = ["tiny"] if args.smoke else [m for m in args.models.split(",") if m in ("9B", "35B-A3B")]
    run.each_model(models, {}, bench_model, args.recipes.split(","))
    run.results["targets"] = targets(run.results)
    run.save()
    print_table(run.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
