"""Pipeline stages of the fast Program (issue 16, docs/pipeline.md) against one stage, in the same call.

Per model (9B and 35B-A3B, bf16 random weights): the one-stage Program on the first device, then the staged one on
`--devices` (default `0,1`; `0,0` on one GPU: both ranks share it), each planned at 90% of its devices' memory
(`device_budgets`) with a 32k-token context. For each: the decode step per exact B = 1..8 at a 4k context (a
replay of the greedy decode graph, or over stages its chain of graphs, on the dummy rows: every key on the dummy
page, so attention reads real-sized context), one 8192-token prefill piece, the KV pages the plan holds (and the
tokens they are), and one 32k-token prefill on the dummy row (that the sequence fits). The table gives staged /
one stage per B with the issue's targets: decode B = 1 <= 1.1x the one-stage step, KV capacity about doubled on two
GPUs (on `0,0` it is the same budget, so about equal), the 32k sequence fits.

Run: python benchmarks/gpu/bench_pp.py [--models 9B,35B-A3B] [--devices 0,1] [--deadline-s 550] [--out DIR]
     python benchmarks/gpu/bench_pp.py --smoke   # the tiny shape, cpu,cpu stages, naive kernels, on the CPU
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlog import Run, bench_arguments, free_device, print_problems  # noqa: E402
from shapes import config, random_source  # noqa: E402

from ninfer.fast.program import FastProgram, FastProgramConfig  # noqa: E402
from ninfer.pipeline import parse_devices  # noqa: E402
from ninfer.pipeline.budgets import device_budgets  # noqa: E402

LANES = 8


@dataclass(frozen=True)
class Settings:
    devices: tuple[str, ...] = ("cuda:0", "cuda:1")
    kernels: str = "triton"
    batches: tuple[int, ...] = tuple(range(1, LANES + 1))
    decode_ctx: int = 4096
    prefill_tokens: int = 8192
    long_tokens: int = 32768  # the one long sequence, also the planned max_context
    repeats: int = 5
    budget_bytes: int | None = None  # None: 90% of each device's memory (device_budgets)
    kv_pages: int | None = None  # a cap (the CPU smoke run)


SMOKE = Settings(devices=("cpu", "cpu"), kernels="naive", batches=(1, 2), decode_ctx=24, prefill_tokens=64,
                 long_tokens=128, repeats=1, budget_bytes=64 << 20, kv_pages=80)
MIN_SECONDS = {"9B": 150, "35B-A3B": 200, "tiny": 1}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(program: FastProgram, repeats: int, fn) -> float:
    """The shortest of `repeats` runs of `fn`, in ms, synchronized on every device of the Program."""
    devices = set(program.model.devices)
    best = float("inf")
    for _ in range(repeats):
        for d in devices:
            _sync(d)
        t = time.perf_counter()
        fn()
        for d in devices:
            _sync(d)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def build(cfg, s: Settings, devices: tuple[str, ...]) -> FastProgram:
    staged = len(devices) > 1
    budgets = s.budget_bytes if s.budget_bytes is not None else device_budgets(devices, 0.9)
    if not staged and isinstance(budgets, list):
        budgets = budgets[0]
    settings = FastProgramConfig(max_concurrency=LANES, max_context=s.long_tokens, checkpoint_slots=2,
                                 max_prefill_tokens=s.prefill_tokens, kv_pages=s.kv_pages,
                                 devices=devices if staged else None)
    return FastProgram.build(cfg, random_source(cfg, devices[0]), settings, budget_bytes=budgets,
                             device=devices[0], kernels=s.kernels)


def decode_ms(program: FastProgram, s: Settings, B: int) -> float:
    """One greedy decode step of B rows at the decode context on the dummy slot and row (graphs on CUDA)."""
    plan, runner = program.model.plan, program.runner
    ctx = s.decode_ctx
    columns = ([0] * B, [plan.dummy_slot] * B, [plan.dummy_row] * B, [ctx] * B, [ctx - 1] * B)
    program.sampler.fill_dummy(B, "greedy")
    return _best(program, s.repeats, lambda: runner.run_lists(columns, variant="greedy"))


def prefill_ms(program: FastProgram, s: Settings) -> float:
    plan, model = program.model.plan, program.model
    ids = torch.zeros(s.prefill_tokens, dtype=torch.long, device=model.device)
    return _best(program, s.repeats, lambda: model.prefill(ids, plan.dummy_slot, plan.dummy_row, 0))


def measure(cfg, s: Settings, devices: tuple[str, ...]) -> dict:
    program = build(cfg, s, devices)
    plan = program.model.plan
    out = dict(devices=list(devices), layers=list(program.stage_plan.layers), kv_pages=plan.num_pages,
               kv_tokens=plan.num_pages * plan.page_size, graphs=len(program.runner.graphs),
               decode=[dict(B=B, step_ms=decode_ms(program, s, B)) for B in s.batches],
               prefill_ms=prefill_ms(program, s))
    out["long_fits"] = plan.num_pages >= program.config.pages_for(s.long_tokens)
    long_ids = torch.zeros(s.long_tokens, dtype=torch.long, device=program.model.device)
    t = time.perf_counter()
    program.model.prefill(long_ids, plan.dummy_slot, plan.dummy_row, 0)
    for d in set(program.model.devices):
        _sync(d)
    out["long_prefill_s"] = time.perf_counter() - t  # once: the first 32k pass of this Program
    out["link_bytes"] = 0 if program.link is None else program.link.bytes
    program.runner.reset()
    del program, long_ids
    free_device(devices[0].split(":")[0])
    return out


def bench_model(run: Run, name: str) -> None:
    s, cfg = run.s, config(name)
    one = measure(cfg, s, s.devices[:1])
    staged = measure(cfg, s, s.devices)
    by_b = {d["B"]: d["step_ms"] for d in one["decode"]}
    ratios = {d["B"]: d["step_ms"] / by_b[d["B"]] for d in staged["decode"]}
    run.results["models"][name] = dict(one=one, staged=staged, decode_ratio=ratios,
                                       prefill_ratio=staged["prefill_ms"] / one["prefill_ms"],
                                       kv_ratio=staged["kv_pages"] / one["kv_pages"],
                                       targets=dict(decode_b1=ratios[min(ratios)] <= 1.1,
                                                    kv_doubled=staged["kv_pages"] >= 1.8 * one["kv_pages"],
                                                    long_fits=staged["long_fits"]))


def print_table(results: dict) -> None:
    print("=" * 100)
    print(f"pipeline stages vs one stage on {results['device']} (devices {','.join(results['devices'])})")
    for name, m in results["models"].items():
        one, st = m["one"], m["staged"]
        print(f"{name}: stages {st['layers']}; KV pages {one['kv_pages']} -> {st['kv_pages']} "
              f"(x{m['kv_ratio']:.2f}, {st['kv_tokens']} tokens); prefill {results['prefill']} "
              f"{one['prefill_ms']:.1f} -> {st['prefill_ms']:.1f} ms; 32k fits {st['long_fits']} "
              f"({st['long_prefill_s']:.2f} s)")
        print("  B      one ms   staged ms   ratio")
        for a, b in zip(one["decode"], st["decode"]):
            print(f"  {a['B']:<5}{a['step_ms']:>8.3f}{b['step_ms']:>12.3f}{b['step_ms'] / a['step_ms']:>8.2f}")
        print(f"  targets: {m['targets']}")
    print_problems(results)


def main() -> int:
    ap = bench_arguments(550.0, "the tiny shape on cpu,cpu stages with the naive kernels")
    ap.add_argument("--devices", default=os.environ.get("PP_DEVICES", "0,1"))
    args = ap.parse_args()
    s = SMOKE if args.smoke else dataclasses.replace(Settings(), devices=parse_devices(args.devices))
    run = Run(args.deadline_s, args.out, s, "bench_pp.json")
    run.results.update(devices=list(s.devices), prefill=s.prefill_tokens, decode_ctx=s.decode_ctx)
    if not run.need_cuda(args.smoke, print_table):
        return 1
    models = ["tiny"] if args.smoke else [m for m in args.models.split(",") if m in MIN_SECONDS]
    run.each_model(models, MIN_SECONDS, bench_model)
    print_table(run.results)
    return 0 if not run.results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
