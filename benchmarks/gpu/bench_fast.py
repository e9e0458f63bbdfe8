"""Fast-path GPU benchmark: HBM bandwidth, then per model shape (random bf16 weights) decode time per step at
B = 1, 2, 4, 8 with 512- and 8192-token contexts, eager and with CUDA graphs, prefill throughput at 2048 and 8192
tokens, the bandwidth floor of every decode case, and peak device memory. Each part may fail without stopping the
others; a wall-clock deadline skips what no longer fits. Prints a table last; writes JSON to $OUT when set.

Run: python benchmarks/gpu/bench_fast.py [--models 0.8B,9B,35B-A3B] [--deadline-s 330] [--out DIR]
         [--kernels triton,triton-fused]   # each op table in turn, the second and later as "MODEL/TABLE" rows
     python benchmarks/gpu/bench_fast.py --smoke   # the same code paths on a CPU: tiny shape, naive kernels
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import cuda_ms, decode_floor, hbm_bandwidth  # noqa: E402
from parity import parity  # noqa: E402
from report import print_table  # noqa: E402
from runlog import Run, bench_arguments  # noqa: E402
from shapes import config, random_source  # noqa: E402

from ninfer.fast.graph_runner import DecodeGraphRunner  # noqa: E402
from ninfer.fast.memory import device_budget, plan_memory  # noqa: E402
from ninfer.fast.model import FastModel  # noqa: E402



@dataclass(frozen=True)
class Settings:
    device: str = "cuda"
    kernels: str = "triton"
    batches: tuple[int, ...] = (1, 2, 4, 8)
    contexts: tuple[int, ...] = (512, 8192)
    prefill: tuple[int, ...] = (2048, 8192)

    @property
    def max_context(self) -> int:
        return max(max(self.contexts), max(self.prefill)) + 64


SMOKE = Settings(device="cpu", kernels="naive", batches=(1, 2), contexts=(16, 40), prefill=(64, 100))
# the MoE model is optional: it needs about this many seconds (weights, compiles, graphs) to be worth starting
MIN_SECONDS = {"0.8B": 40, "9B": 60, "35B-A3B": 110, "tiny": 1}
# real-shape parity against the host reference (fp32 on the CPU): the smallest real shape keeps it to seconds
PARITY_MODELS = ("0.8B", "tiny")


def build(name: str, s: Settings):
    cfg = config(name)
    on_gpu = s.device == "cuda"
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    seqs, per = max(s.batches), -(-s.max_context // 16)
    plan = plan_memory(cfg, device_budget(0.9) if on_gpu else 1 << 32, max_seqs=seqs, max_context=s.max_context,
                       page_size=16, max_prefill_tokens=max(s.prefill), max_kv_pages=seqs * per)
    source = random_source(cfg, s.device)
    model = FastModel.build(cfg, source, plan, s.device, s.kernels)
    # sequence b uses slot b, table row b and its own run of pages
    for b in range(seqs):
        model.pools.block_tables[b] = torch.arange(b * per, (b + 1) * per, dtype=torch.int32, device=s.device)
    if on_gpu:
        torch.cuda.synchronize()
    return cfg, plan, model, source


def decode_inputs(cfg, B: int, ctx: int, device: str):
    i32 = dict(dtype=torch.int32, device=device)
    return (torch.randint(0, cfg.vocab_size, (B,), device=device), torch.arange(B, **i32), torch.arange(B, **i32),
            torch.full((B,), ctx + 1, **i32), torch.full((B,), ctx, **i32))


def bench_decode(run: Run, name: str, cfg, model, entry: dict, bw: float) -> None:
    """Eager first (it also compiles every kernel), then graphs captured once per B and replayed at both contexts:
    the same graph serves any context length because lengths and pages are data."""
    s = run.s
    rows = entry.setdefault("decode", [])
    for ctx in s.contexts:
        for B in s.batches:
            args = decode_inputs(cfg, B, ctx, s.device)
            ms = cuda_ms(lambda: model.decode(*args).argmax(-1), iters=5 if run.left() < 120 else 10)
            rows.append({"ctx": ctx, "B": B, "eager_ms": ms, **decode_floor(cfg, B, ctx, bw)})
            run.save()
    if run.left() < 25:
        run.results["skipped"].append(f"{name} graphs (deadline)")
        return
    runner = DecodeGraphRunner(model, max_batch=max(s.batches), greedy=True)
    t = time.monotonic()
    runner.capture(list(s.batches))
    entry["graph_capture_s"] = time.monotonic() - t
    for row in rows:
        args = decode_inputs(cfg, row["B"], row["ctx"], s.device)
        # without graphs (a CPU smoke run) this times the runner's eager path
        row["graph_ms" if runner.use_graphs else "runner_eager_ms"] = cuda_ms(lambda: runner.run(*args), iters=20)
        logits = runner.run(*args)[0]
        row["finite"] = bool(torch.isfinite(logits).all())
    runner.reset()


def bench_prefill(run: Run, name: str, model, entry: dict) -> None:
    dev = run.s.device
    rows = entry.setdefault("prefill", [])
    model.prefill(torch.randint(0, 100, (256 if dev == "cuda" else 8,), device=dev), 0, 0, 0)  # compiles kernels
    for T in run.s.prefill:
        if run.left() < 15:
            run.results["skipped"].append(f"{name} prefill T={T} (deadline)")
            continue
        tokens = torch.randint(0, model.cfg.vocab_size, (T,), device=dev)
        ms = cuda_ms(lambda: model.prefill(tokens, 0, 0, 0), iters=2, warmup=1)
        last = model.prefill(tokens, 0, 0, 0)
        rows.append({"T": T, "ms": ms, "tok_s": T / ms * 1e3, "finite": bool(torch.isfinite(last).all())})


def bench_model(run: Run, name: str, bw: float, suffix: str = "") -> None:
    """One model's decode, prefill, memory and parity; its results under ``name + suffix`` (an op table's)."""
    label = name + suffix
    entry = run.results["models"].setdefault(label, {})
    t = time.monotonic()
    cfg, plan, model, source = build(name, run.s)
    entry.update(build_s=time.monotonic() - t, weight_bytes=model.weights.nbytes, plan_bytes=plan.total_bytes,
                 kv_pages=plan.num_pages, page_size=plan.page_size)
    try:
        run.part(f"{name} decode", bench_decode, run, name, cfg, model, entry, bw)
        if run.left() > 15:
            run.part(f"{name} prefill", bench_prefill, run, name, model, entry)
        else:
            run.results["skipped"].append(f"{name} prefill (deadline)")
        if run.s.device == "cuda":
            entry["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            entry["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
            # what the plan's workspace estimate has to cover: everything above weights and pools
            resident = model.weights.nbytes + plan.kv_bytes + plan.state_bytes + plan.table_bytes
            entry.update(transient_peak_bytes=entry["peak_allocated_bytes"] - resident,
                         workspace_planned_bytes=plan.workspace_bytes)
        # after the memory numbers: the parity check's own weight copies are not the engine's memory
        if name in PARITY_MODELS and label == name and run.left() > 60:
            entry["parity"] = run.part(f"{name} parity", parity, model, source)
    finally:
        del model
        if run.s.device == "cuda":
            torch.cuda.empty_cache()


def main() -> int:
    ap = bench_arguments(330.0, "tiny shape on the CPU with the naive kernels")
    ap.add_argument("--kernels", default="triton", help="op tables to time in turn, e.g. triton,triton-fused "
                                                        "(--smoke: naive only)")
    args = ap.parse_args()
    run = Run(args.deadline_s, args.out, SMOKE if args.smoke else Settings(), "bench_fast.json")
    if not run.need_cuda(args.smoke, print_table):
        return 1
    bw = (run.part("bandwidth", hbm_bandwidth) or {}) if not args.smoke else {}
    run.results["bandwidth"] = bw
    tables = [run.s.kernels] if args.smoke else args.kernels.split(",")
    for i, kernels in enumerate(tables):
        run.s = replace(run.s, kernels=kernels)
        run.each_model(["tiny"] if args.smoke else args.models.split(","), MIN_SECONDS, bench_model,
                       bw.get("copy_tb_s", 0.0), "" if i == 0 else f"/{kernels}")
    print_table(run.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
