"""Which kernels take the CUDA graphs' time where issue 14 misses its targets (docs/performance.md, the sixth
session's H100 runs): a graphed 64-token prefill piece costs 2.48 ms on 0.8B (a decode step 1.23 ms), and the MTP
round's verify graph 1.34x a 9B decode step for 4 rows.

Per model, on the Program bench_engine.py builds (plain decoding, prefill graphs up to 512 tokens): the prefill
graph buckets 64 and 512 (`PrefillGraphRunner.run` on the dummy slot and row at position 0: the slot reset, the
inputs' copy and the replay, what PrefillCosts times) and the greedy decode graph at B = 1 on the dummy row at
`context` positions, the verify pass's yardstick. Per speculative model (9B), on the Program bench_spec.py builds
(MTP k = 3; `--spec-method dflash` or `dflash2`: a drafter of the published geometry, block 16): the round's graphs
at B = 1 from spec_graphs.py's cases (verify, a cut block's replay, the draft: MTP's start + k steps, DFlash's
block pass and draws; greedy, lean greedy and sort) at the same context.

Each case: a run's wall time between device syncs (median of `reps`), the replay's device time back to back (CUDA
events), the kernel table of `calls` runs (kernel_table.py: CUPTI sees the kernels inside a replay) with its sum
and span, and the same body launched eagerly, timed and profiled too. The sum against the wall and device times is
what the graph pays besides its kernels (launch gaps, the graph launch). Where the replay's table holds fewer than
half the eager body's launches, CUPTI missed the graph's kernels on this torch, and the eager table stands in
(`profiled` says which). On a CPU (--smoke) nothing is captured: the eager bodies and the profiler's operators run.

Run: python benchmarks/gpu/profile_graphs.py [--models 0.8B,9B] [--spec-models 9B] [--spec-method dflash2]
     [--recipes fp8,q4]
     [--deadline-s 540] [--out DIR]   (--recipes: the same plain graphs on bench_quant.py's quantized weights)
     python benchmarks/gpu/profile_graphs.py --smoke   # tiny shape on the CPU, naive kernels
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_engine  # noqa: E402
import bench_quant  # noqa: E402
import bench_spec  # noqa: E402
from kernel_table import kernel_table  # noqa: E402
from measure import cuda_ms  # noqa: E402
from runlog import Run, bench_arguments, close, free_device, print_problems  # noqa: E402
from spec_graphs import median_ms, round_cases  # noqa: E402

from ninfer.fast.sampling.rows import GREEDY  # noqa: E402


@dataclass(frozen=True)
class Settings:
    engine: bench_engine.Settings = bench_engine.Settings()
    spec: bench_spec.Settings = dataclasses.replace(bench_spec.Settings(), batches=(1,))
    buckets: tuple[int, ...] = (64, 512)
    calls: int = 5  # profiled runs per table
    reps: int = 20  # timed runs per figure

    @property
    def device(self) -> str:
        return self.engine.device

    @property
    def context(self) -> int:
        """The decode, verify and draft cases' context: bench_spec's prompt length, as its round_graphs."""
        return self.spec.prompt_len


SMOKE = Settings(bench_engine.SMOKE, dataclasses.replace(bench_spec.SMOKE, program="fast", batches=(1,)), calls=2,
                 reps=1)
MIN_SECONDS = {"0.8B": 40, "9B": 70, "35B-A3B": 100, "tiny": 1}
FEW_KERNELS = 0.5  # a replay's table under this share of the eager body's launches: CUPTI missed the graph


def profile_case(s: Settings, case: str, run_once, replay, eager) -> dict:
    """`run_once`: one run as the Program pays it (for a graph case: the replay, or the runner's call around it);
    `replay`: the captured graph alone (None: nothing captured); `eager`: the same body launched eagerly."""
    out = {"case": case, "wall_ms": median_ms(run_once, s.device, s.reps),
           "eager_ms": median_ms(eager, s.device, s.reps), "replay_device_ms": None}
    eager_table = kernel_table(eager, s.calls)
    out["eager"] = eager_table.as_dict()
    if replay is None:
        out.update(profiled="eager body (nothing captured)", graph=None)
        return out
    out["replay_device_ms"] = cuda_ms(replay, iters=s.reps)
    table = kernel_table(run_once, s.calls)
    out["graph"] = table.as_dict()
    seen = table.launches >= FEW_KERNELS * eager_table.launches
    out["profiled"] = "replay" if seen else (f"eager body (the replay showed {table.launches:.0f} of the eager "
                                             f"body's {eager_table.launches:.0f} launches)")
    return out


def plain_cases(s: Settings, program) -> list[dict]:
    """The prefill graph buckets of `s.buckets` this Program has, then the greedy decode graph at B = 1."""
    plan, pieces, rows = program.model.plan, program.pieces, []
    for bucket in [b for b in s.buckets if pieces is not None and b in pieces.buckets]:
        tokens = [0] * bucket

        def run_once(tokens=tokens):
            pieces.run(tokens, plan.dummy_slot, plan.dummy_row, 0)
        run_once()  # the static inputs now hold this bucket's piece, for the replay and the eager body
        graph = pieces.graphs.get(bucket)
        rows.append(profile_case(s, f"prefill {bucket}", run_once, None if graph is None else graph.replay,
                                 lambda bucket=bucket: pieces.body(bucket)))
    runner, ctx = program.runner, s.context
    program.sampler.fill_dummy(1, GREEDY)
    runner.run_lists(([0], [plan.dummy_slot], [plan.dummy_row], [ctx + 1], [ctx]), GREEDY)  # fills the inputs
    graph = runner.graphs.get((1, GREEDY))
    replay = None if graph is None else graph.replay
    rows.append(profile_case(s, "decode B=1", replay or (lambda: runner.body(1, GREEDY)), replay,
                             lambda: runner.body(1, GREEDY)))
    return rows


def round_case_rows(s: Settings, program) -> list[dict]:
    rows = []
    for c in round_cases(program, s.spec.batches, s.context):
        c.prepare()
        rows.append(profile_case(s, f"{c.name} B={c.B}", c.replay or c.eager, c.replay, c.eager))
    if not rows:
        raise RuntimeError("the Program has no speculative round graphs (no verifier)")
    return rows


def profile_plain(run: Run, name: str, recipe: str = "bf16") -> None:
    """The plain Program's graphs; a quantized `recipe` (bench_quant.py's random planes) builds it as bench_quant
    does."""
    if recipe == "bf16":
        program, engine, info = bench_engine.build(run.s.engine, name)
    else:
        program, engine, info = bench_quant.build(SimpleNamespace(s=run.s.engine), name, recipe)
    entry = run.results["models"].setdefault(name, {})
    entry["prefill_graph_buckets"] = info.get("prefill_graph_buckets")
    try:
        entry.setdefault("cases", []).extend(dict(r, program="plain" if recipe == "bf16" else f"plain {recipe}")
                                             for r in plain_cases(run.s, program))
    finally:
        close(program, engine)
        del program, engine
        free_device(run.s.device)


def profile_round(run: Run, name: str) -> None:
    s = run.s.spec
    k = bench_spec.ks(s)[0]
    program, engine = bench_spec.build(s, name, k)
    entry = run.results["models"].setdefault(name, {})
    try:
        entry.setdefault("cases", []).extend(dict(r, program=f"{s.method} k={k}")
                                             for r in round_case_rows(run.s, program))
    finally:
        close(program, engine)
        del program, engine
        free_device(run.s.device)


def _ms(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def print_case(name: str, c: dict, top: int = 18) -> None:
    g = c["graph"] if c["profiled"] == "replay" else c["eager"]
    span = None if g["span_us"] is None else g["span_us"] / 1e3
    print(f"\n== {name} {c['case']} ({c['program']}): run {_ms(c['wall_ms'])} ms between syncs, replay "
          f"{_ms(c['replay_device_ms'])} ms back to back on the device, eager body {_ms(c['eager_ms'])} ms")
    unit = "kernels" if g["device_kernels"] else "CPU operators (self time)"
    print(f"   profiled: {c['profiled']}; {unit} {g['kernel_us'] / 1e3:.3f} ms in {g['launches']:.0f} launches, "
          f"span {_ms(span)} ms; run - kernels = {c['wall_ms'] - g['kernel_us'] / 1e3:.3f} ms")
    if c["graph"] is not None and c["profiled"] == "replay":
        e = c["eager"]
        print(f"   the same body eagerly: kernels {e['kernel_us'] / 1e3:.3f} ms in {e['launches']:.0f} launches")
    for row in g["top"][:top]:
        print(f"  {row['us']:9.1f} us  x{row['count']:5.0f}  {row['kernel']}")


def print_report(results: dict) -> None:
    print("\n" + "=" * 100)
    print(f"kernels inside the graphs on {results.get('device')} (torch {results.get('torch')}), random bf16 weights")
    cases = [(name, c) for name, m in results.get("models", {}).items() for c in m.get("cases", [])]
    for name, c in cases:
        print_case(name, c)
    print(f"\n{'model':8} {'case':20} {'run ms':>7} {'replay':>7} {'kernels':>8} {'launches':>8} {'span':>7} "
          f"{'eager ms':>8}  table")
    print("(run: one run between device syncs; replay: replays back to back on the device; kernels, launches and "
          "span: per run, from the graph's table or the eager body's)")
    for name, c in cases:
        g = c["graph"] if c["profiled"] == "replay" else c["eager"]
        span = None if g["span_us"] is None else g["span_us"] / 1e3
        print(f"{name:8} {c['case']:20} {_ms(c['wall_ms']):>7} {_ms(c['replay_device_ms']):>7} "
              f"{g['kernel_us'] / 1e3:8.3f} {g['launches']:8.0f} {_ms(span):>7} {_ms(c['eager_ms']):>8}  "
              f"{'graph' if g is c['graph'] else 'eager'}")
    print_problems(results)


def main() -> int:
    ap = bench_arguments(540.0, "tiny shape on the CPU (naive kernels, eager bodies, the profiler's CPU operators)")
    ap.set_defaults(models="0.8B,9B")
    ap.add_argument("--spec-models", default="9B", help="models whose speculative round graphs are profiled ('' for none)")
    ap.add_argument("--spec-method", choices=("mtp", "dflash", "dflash2"), default="mtp",
                    help="the backend of the round graphs (a DFlash drafter of the published geometry, block 16)")
    ap.add_argument("--recipes", default="", help="quantized recipes (bench_quant.py's: fp8, q4, nvfp4) whose plain "
                    "graphs are profiled after the bf16 ones, per model")
    args = ap.parse_args()
    s = SMOKE if args.smoke else Settings()
    if args.spec_method != "mtp":  # bench_spec's DFlash settings: block 16 (8 on the CPU), a drafter built with it
        blocks = (8,) if args.smoke else (16,)
        s = dataclasses.replace(s, spec=dataclasses.replace(s.spec, method=args.spec_method, blocks=blocks))
    run = Run(args.deadline_s, args.out, s, "profile_graphs.json")
    if not run.need_cuda(args.smoke, print_report):
        return 1
    plain = ["tiny"] if args.smoke else [m for m in args.models.split(",") if m]
    spec = ["tiny"] if args.smoke else [m for m in args.spec_models.split(",") if m]
    recipes = [r for r in args.recipes.split(",") if r]
    parts = [("prefill and decode", m, profile_plain, ()) for m in plain]
    parts += [(f"{r} prefill and decode", m, profile_plain, (r,)) for m in plain for r in recipes]
    for part, name, fn, extra in parts + [(f"{args.spec_method} round", m, profile_round, ()) for m in spec]:
        if run.left() < MIN_SECONDS.get(name, 60):
            run.results["skipped"].append(f"{name} {part} (deadline: {run.left():.0f}s left)")
            continue
        run.part(f"{name} {part}", fn, run, name, *extra)
    run.results["wall_s"] = time.monotonic() - run.t0
    run.save()
    print_report(run.results)
    return 0 if not run.results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
