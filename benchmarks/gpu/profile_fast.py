"""Where the fast model's device time goes: per-kernel totals (kernel_table.py: CUPTI) over eager decode steps
and one prefill, for the kernels worth fusing or tuning next. Eager, so every kernel is seen; kernel durations are
what a graph replays, and the sum against the graph's step time shows the launch gaps the graph still pays.
Each decode case also reports its launches per step and per layer: the device's count (cuBLAS's split-K reduces
included) and the host's count per sublayer (``ninfer.testing.launches.count_step``, what the CPU test asserts).

Run: python benchmarks/gpu/profile_fast.py [--models 0.8B,9B,35B-A3B] [--out DIR] [--prefill 8192]
     python benchmarks/gpu/profile_fast.py --smoke   # a CPU: the tiny model's host launch count only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fast import SMOKE, Settings, build, decode_inputs  # noqa: E402
from kernel_table import kernel_table  # noqa: E402
from measure import cuda_ms  # noqa: E402

from ninfer.fast.graph_runner import DecodeGraphRunner  # noqa: E402
from ninfer.testing.launches import count_step  # noqa: E402

STEPS = 5


def host_launches(cfg, fn) -> dict:
    """Launches of one call counted on the host: per GDN and attention layer (mixer + FFN) and the step's own."""
    c = count_step(fn).counts()
    n_gdn, n_attn = len(cfg.linear_layers), len(cfg.attention_layers)
    per_ffn = c["ffn"] / cfg.num_hidden_layers
    return {"total": sum(c.values()), "step": c["step"],
            "per_gdn_layer": c["gdn"] / n_gdn + per_ffn if n_gdn else 0.0,
            "per_attention_layer": c["attention"] / n_attn + per_ffn if n_attn else 0.0}


def profile_model(name: str, prefill_T: int) -> dict:
    s = Settings(batches=(1, 8), contexts=(512,), prefill=(prefill_T,))
    cfg, plan, model, _ = build(name, s)
    out: dict = {}
    for B in (1, 8):
        args = decode_inputs(cfg, B, 512, "cuda")
        table = kernel_table(lambda: model.decode(*args), STEPS)
        runner = DecodeGraphRunner(model, max_batch=B)
        runner.capture([B])
        graph_ms = cuda_ms(lambda: runner.run(*args), iters=20)
        runner.reset()
        out[f"decode_B{B}"] = {**table.as_dict(), "graph_us": graph_ms * 1e3,
                               "launches_per_layer": table.launches / cfg.num_hidden_layers,
                               "host_launches": host_launches(cfg, lambda: model.decode(*args))}
    tokens = torch.randint(0, cfg.vocab_size, (prefill_T,), device="cuda")
    out[f"prefill_T{prefill_T}"] = kernel_table(lambda: model.prefill(tokens, 0, 0, 0), 1).as_dict()
    return out  # the model dies with this frame; main empties the cache before the next one


def smoke_model(name: str, prefill_T: int) -> dict:
    """No CUPTI on a CPU: the host launch count of a tiny decode step (naive kernels), so the counting code runs."""
    cfg, _, model, _ = build(name, SMOKE)
    args = decode_inputs(cfg, 2, 16, "cpu")
    return {"decode_B2": {"host_launches": host_launches(cfg, lambda: model.decode(*args))}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="0.8B,9B,35B-A3B")
    ap.add_argument("--prefill", type=int, default=8192)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    results = {}
    for name in ["tiny"] if args.smoke else args.models.split(","):
        try:
            results[name] = smoke_model(name, args.prefill) if args.smoke else profile_model(name, args.prefill)
        except Exception as exc:  # noqa: BLE001 - report and go on to the next model
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "profile_fast.json").write_text(json.dumps(results, indent=1))
    for name, r in results.items():
        for case, c in r.items():
            if case == "error":
                print(f"{name}: ERROR {c}")
                continue
            if "kernel_us" in c:
                print(f"\n== {name} {case}: kernels {c['kernel_us']:.0f} us/call, {c['launches']:.0f} launches"
                      + (f", graph replay {c['graph_us']:.0f} us" if "graph_us" in c else ""))
            if "host_launches" in c:
                h = c["host_launches"]
                device = (f" on the device ({c['launches_per_layer']:.1f} per layer)" if "launches" in c else "")
                print(f"  {name} {case} launches per step: {c.get('launches', h['total']):.0f}{device}; "
                      f"{h['total']} on the host: {h['per_gdn_layer']:.1f} per GDN layer, "
                      f"{h['per_attention_layer']:.1f} per attention layer, {h['step']} for the step")
            for row in c.get("top", [])[:18]:
                print(f"  {row['us']:8.1f} us  x{row['count']:5.0f}  {row['kernel']}")
    errors = [n for n, r in results.items() if "error" in r]
    return 1 if args.smoke and errors else 0


if __name__ == "__main__":
    sys.exit(main())
