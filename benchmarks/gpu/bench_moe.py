"""MoE block micro-benchmark at decode (issue 14): from the router logits on, today's path (the default "triton"
table's ``Kernels.moe_block``: route, align, the two grouped GEMMs, the combine, the shared expert's GEMVs and its
gate) against ``moe_decode`` (two launches, the block added to the residual stream as the "triton-fused" table runs
it), per B = 1, 2, 4, 8 at the 35B-A3B shape (hidden 2048, 256 experts of 512, top-8, a shared expert of 512), with
a sweep of ``moe_decode`` configurations.

Each case is timed inside a CUDA graph of back-to-back calls, each on its own copy of the layer's weights (the copies
together far past the L2 cache) and its own random router logits, so the chosen experts stream from HBM. The floor
of a call is the bytes it must read (the distinct experts its rows chose, the shared expert, each once) over the
copy bandwidth measured in the same run; printed: us per call, % of the floor, and the error against
``moe_decode_naive``. ``--smoke`` runs every case once on the CPU (interpreter, tiny shape, fp32): CI runs it
(tests/benchmarks/test_gpu_scripts_smoke.py).

Run: python benchmarks/gpu/bench_moe.py [--batches 1,2,4,8] [--out DIR] [--smoke]   (or ``bash benchmarks/gpu/run.sh moe``)
"""

from __future__ import annotations

import os
import sys

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import graph_us, hbm_bandwidth  # noqa: E402
from runlog import Run, bench_arguments  # noqa: E402
from shapes import config  # noqa: E402

from ninfer.fast.model.kernels import Residual, triton_kernels  # noqa: E402
from ninfer.fast.ops.gemv.triton import _num_sms  # noqa: E402
from ninfer.fast.ops.moe_decode import MoeDecodeConfig, moe_decode, moe_decode_naive, pick_config  # noqa: E402
from ninfer.testing.numerics import assert_close  # noqa: E402

ROTATE_BYTES = 8 << 30  # weight copies per case: far past the L2 cache
CALLS = 16  # calls per graph, each with its own inputs and router logits
# per B = 1 or more: (gate_bn, gate_bk, down_bn, down_bk, warps, stages) beside the heuristic's choice
SWEEP = {
    1: [(16, 256, 4, 512, 4, 3), (32, 128, 8, 512, 8, 3), (8, 256, 4, 512, 4, 3), (16, 128, 8, 256, 4, 3),
        (16, 64, 4, 512, 4, 3)],
    8: [(16, 64, 4, 256, 8, 3), (8, 64, 4, 256, 8, 3), (16, 32, 4, 128, 4, 3), (16, 32, 8, 256, 8, 3)],
}


def _geometry(smoke: bool) -> tuple[int, int, int, int, int]:
    """(E, k, H, I, Is): 35B-A3B's, or a tiny one for --smoke."""
    if smoke:
        return 8, 2, 64, 32, 32
    cfg = config("35B-A3B")
    return (cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size, cfg.moe_intermediate_size,
            cfg.shared_expert_intermediate_size)


def _layers(geom, device: str, dtype: torch.dtype, copies: int) -> list[tuple[torch.Tensor, ...]]:
    E, k, H, I, Is = geom
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape, fan_in):
        return (torch.randn(*shape, device=device, generator=gen) * fan_in ** -0.5).to(dtype)
    return [(rand(E, 2 * I, H, fan_in=H), rand(E, H, I, fan_in=I), rand(2 * Is, H, fan_in=H), rand(H, Is, fan_in=Is))
            for _ in range(copies)]


def _floor_bytes(geom, logits: list[torch.Tensor], w_bytes: int) -> float:
    """Mean bytes a call must read: each distinct chosen expert (gate_up + down) and the shared expert once."""
    E, k, H, I, Is = geom
    distinct = [len(set(lg[:, :E].float().topk(k, dim=-1).indices.flatten().tolist())) for lg in logits]
    return (sum(distinct) / len(distinct) * 3 * I * H + 3 * Is * H) * w_bytes


def _paths(geom, B: int):
    """name -> fn(x, logits, layer, residual) for every path and swept configuration at B rows."""
    E, k = geom[:2]
    today = triton_kernels(fused_decode=False)

    def run_today(x, logits, layer, h):
        res = Residual(h)
        today.moe_block(x, logits, *layer, k, True, res)
        return res.delta

    def fused(cfg):
        return lambda x, logits, layer, h: moe_decode(x, logits, layer[0], layer[1], k, True, layer[2], layer[3],
                                                      residual=h, config=cfg)
    paths = {"today": run_today, "moe_decode": fused(None)}
    for c in SWEEP[1 if B == 1 else 8]:
        cfg = MoeDecodeConfig(*c)
        paths[f"moe_decode bn{c[0]}/{c[2]} bk{c[1]}/{c[3]} w{c[4]} s{c[5]}"] = fused(cfg)
    return paths


def bench_batch(run: Run, geom, layers, B: int, bw: float, smoke: bool) -> None:
    E, k, H, I, Is = geom
    device, dtype = layers[0][0].device, layers[0][0].dtype
    n = 1 if smoke else CALLS
    xs = [torch.randn(B, H, device=device).to(dtype) for _ in range(n)]
    logits = [torch.randn(B, E + 1, device=device).to(dtype) for _ in range(n)]
    hs = [torch.randn(B, H, device=device).to(dtype) for _ in range(n)]
    floor_us = _floor_bytes(geom, logits, layers[0][0].element_size()) / (bw * 1e6) if bw > 0 else float("nan")
    ref = moe_decode_naive(xs[0], logits[0], *layers[0][:2], k, True, *layers[0][2:])
    print(f"B={B}: default {pick_config(B, H, I, _num_sms(device))}; floor {floor_us:.1f} us", flush=True)
    # --smoke: both paths and one swept configuration
    for name, fn in list(_paths(geom, B).items())[: 3 if smoke else None]:
        try:
            h0 = hs[0].clone()
            out = fn(xs[0], logits[0], layers[0], h0)
            # the fused paths add the block to the stream; today's returns it
            block = out if name == "today" else (out.float() - hs[0].float()).to(dtype)
            assert_close(f"bench_moe {name}", ref, block, 5e-2 if dtype == torch.bfloat16 else 1e-4)
            it = iter(range(1 << 30))

            def call():
                i = next(it)
                return fn(xs[i % n], logits[i % n], layers[i % len(layers)], hs[i % n])
            us = graph_us(call, n)
            row = {"B": B, "path": name, "us": us, "floor_us": floor_us, "pct_floor": 100 * floor_us / us}
            run.results["cases"].append(row)
            print(f"  {name:44} {us:8.1f} us  {row['pct_floor']:5.1f}% of floor", flush=True)
        except Exception as exc:  # noqa: BLE001 - one failing configuration must not stop the sweep
            run.results["errors"][f"B={B} {name}"] = f"{type(exc).__name__}: {exc}"
        run.save()


def print_summary(results: dict) -> None:
    print("\n| B | today us | moe_decode us | best swept us | floor us | moe_decode % of floor |")
    print("|---|---|---|---|---|---|")
    for B in sorted({r["B"] for r in results["cases"]}):
        rows = {r["path"]: r for r in results["cases"] if r["B"] == B}
        swept = [r["us"] for p, r in rows.items() if p.startswith("moe_decode")]
        today, fused = rows.get("today", {}), rows.get("moe_decode", {})
        print(f"| {B} | {today.get('us', float('nan')):.1f} | {fused.get('us', float('nan')):.1f} | "
              f"{min(swept, default=float('nan')):.1f} | {fused.get('floor_us', float('nan')):.1f} | "
              f"{fused.get('pct_floor', float('nan')):.0f}% |")
    for name, err in results["errors"].items():
        print(f"error: {name}: {err}")


def main() -> int:
    ap = bench_arguments(240.0, "tiny shape on the CPU (interpreter), each case once")
    ap.add_argument("--batches", default="1,2,4,8")
    args = ap.parse_args()
    run = Run(args.deadline_s, args.out, None, "bench_moe.json")
    run.results["cases"] = []
    if not run.need_cuda(args.smoke, lambda r: None):
        return 1
    bw = 0.0 if args.smoke else (run.part("bandwidth", hbm_bandwidth) or {}).get("copy_tb_s", 0.0)
    run.results["bandwidth_tb_s"] = bw
    geom = _geometry(args.smoke)
    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    E, k, H, I, Is = geom
    copies = 1 if args.smoke else max(2, ROTATE_BYTES // ((3 * E * I + 3 * Is) * H * 2))
    layers = _layers(geom, device, dtype, copies)
    for B in [int(b) for b in args.batches.split(",")][: 2 if args.smoke else None]:
        if run.left() < 20:
            run.results["skipped"].append(f"B={B} (deadline)")
            continue
        run.part(f"B={B}", bench_batch, run, geom, layers, B, bw, args.smoke)
    print_summary(run.results)
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
