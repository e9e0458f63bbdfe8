"""MoE block micro-benchmark at decode (issue 14): from the router logits on, today's path (route, align, the two
grouped GEMMs, the combine, the shared expert's GEMVs and its gate: ``kernels.unfused_moe_block`` over the "triton"
table's ops) against ``moe_decode`` (two launches, the block added to the residual stream, as the op tables run it:
the default at B=1, "triton-fused" at every B), per B = 1, 2, 4, 8 at the 35B-A3B shape (hidden 2048, 256 experts of
512, top-8, a shared expert of 512). Both paths at every B first, then a sweep of ``moe_decode`` configurations per
B, so a run short of time still has every B's comparison.

Each case is timed inside a CUDA graph of back-to-back calls, each on its own copy of the layer's weights (the copies
together far past the L2 cache) and its own random router logits, so the chosen experts stream from HBM. The floor
of a call is the bytes it must read (the distinct experts its rows chose, the shared expert, each once) over the
copy bandwidth measured in the same run; printed: us per call, % of the floor, and the relative RMS error of the
block against ``moe_decode_naive`` (checked on a zero residual, so the fused paths' block is compared alone; a
configuration past the tolerance is reported and not timed). ``--smoke`` runs every case once on the CPU
(interpreter, tiny shape, fp32): CI runs it (tests/benchmarks/test_gpu_scripts_smoke.py).

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

from ninfer.fast.model.kernels import Residual, triton_kernels, unfused_moe_block  # noqa: E402
from ninfer.fast.ops.gemv.triton import _num_sms  # noqa: E402
from ninfer.fast.ops.moe_decode import MoeDecodeConfig, moe_decode, moe_decode_naive, pick_config  # noqa: E402
from ninfer.testing.numerics import assert_close  # noqa: E402

ROTATE_BYTES = 8 << 30  # weight copies per case: far past the L2 cache
CALLS = 16  # calls per graph, each with its own inputs and router logits
# per B: (gate_bn, gate_bk, down_bn, down_bk, warps, stages) beside pick_config's. On the H100 B=1's best is now
# pick_config's (8, 256, 4, 512, 4); at B=2 the earlier sweep (K tiles 32-64, 8 warps) lost to the default, so B >= 2
# tries narrower gate tiles with longer K tiles at gate_up's 32 accumulator registers a thread (B=1's lesson)
SWEEP = {
    1: [(16, 128, 4, 512, 4, 3), (16, 256, 4, 512, 4, 3), (8, 128, 4, 512, 4, 3)],
    2: [(8, 128, 4, 512, 4, 3), (16, 128, 4, 512, 8, 3)],
    4: [(8, 64, 4, 512, 4, 3), (8, 128, 4, 512, 8, 3)],
    8: [(8, 32, 4, 256, 4, 3), (8, 64, 4, 256, 8, 3)],
}
# the block's bf16 error against the fp32 definition at 35B-A3B: moe_decode rounds once (0.4% relative RMS in the
# interpreter), today's path five times (its roundings emulated in torch: 0.45%); a wrong tile of one expert is ~5%
BF16_TOL = 2e-2


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


def _paths(geom, B: int, sweep: bool) -> dict:
    """name -> fn(x, logits, layer, residual) -> the block (today's path) or the residual with the block added: both
    paths, or the swept configurations (those of the nearest B listed)."""
    k = geom[1]

    def fused(cfg):
        return lambda x, logits, layer, h: moe_decode(x, logits, layer[0], layer[1], k, True, layer[2], layer[3],
                                                      residual=h, config=cfg)
    if sweep:
        near = max(b for b in SWEEP if b <= B)
        return {f"moe_decode bn{c[0]}/{c[2]} bk{c[1]}/{c[3]} w{c[4]} s{c[5]}": fused(MoeDecodeConfig(*c))
                for c in SWEEP[near]}
    ops = triton_kernels(fused_decode=False)
    today = unfused_moe_block(ops.moe_route, ops.moe_experts, ops.linear, ops.linear_swiglu)

    def run_today(x, logits, layer, h):
        res = Residual(h)
        today(x, logits, *layer, k, True, res)
        return res.delta
    return {"today": run_today, "moe_decode": fused(None)}


def _inputs(geom, layers, B: int, bw: float, n: int) -> dict:
    """B's n calls' inputs, router logits and residuals, the floor of a call and the definition's block."""
    E, k, H = geom[:3]
    device, dtype = layers[0][0].device, layers[0][0].dtype
    xs = [torch.randn(B, H, device=device).to(dtype) for _ in range(n)]
    logits = [torch.randn(B, E + 1, device=device).to(dtype) for _ in range(n)]
    hs = [torch.randn(B, H, device=device).to(dtype) for _ in range(n)]
    floor_us = _floor_bytes(geom, logits, layers[0][0].element_size()) / (bw * 1e6) if bw > 0 else float("nan")
    ref = moe_decode_naive(xs[0], logits[0], *layers[0][:2], k, True, *layers[0][2:])
    return dict(xs=xs, logits=logits, hs=hs, floor_us=floor_us, ref=ref)


def _rel_err(ref: torch.Tensor, out: torch.Tensor) -> float:
    r, o = ref.double().cpu(), out.double().cpu()
    return ((o - r).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item()


def bench_batch(run: Run, layers, B: int, inp: dict, paths: dict) -> None:
    xs, logits, hs, ref, floor_us = inp["xs"], inp["logits"], inp["hs"], inp["ref"], inp["floor_us"]
    n = len(xs)
    tol = BF16_TOL if ref.dtype == torch.bfloat16 else 1e-4
    for name, fn in paths.items():
        if run.left() < 20:
            run.results["skipped"].append(f"B={B} {name} (deadline)")
            continue
        try:
            # on a zero residual the fused paths' output is their block rounded once, as today's path returns it
            block = fn(xs[0], logits[0], layers[0], torch.zeros_like(hs[0]))
            err = _rel_err(ref, block)
            assert_close(f"bench_moe {name}", ref, block, tol)
            it = iter(range(1 << 30))

            def call():
                i = next(it)
                return fn(xs[i % n], logits[i % n], layers[i % len(layers)], hs[i % n])
            us = graph_us(call, n)
            row = {"B": B, "path": name, "us": us, "floor_us": floor_us, "pct_floor": 100 * floor_us / us,
                   "rel_err": err}
            run.results["cases"].append(row)
            print(f"  {name:44} {us:8.1f} us  {row['pct_floor']:5.1f}% of floor  err {err:.1e}", flush=True)
        except Exception as exc:  # noqa: BLE001 - one failing configuration must not stop the sweep
            run.results["errors"][f"B={B} {name}"] = f"{type(exc).__name__}: {exc}"
        run.save()


def print_summary(results: dict) -> None:
    print("\n| B | today us | moe_decode us | best swept us (config) | floor us | moe_decode % of floor | worst err |")
    print("|---|---|---|---|---|---|---|")
    nan = float("nan")
    for B in sorted({r["B"] for r in results["cases"]}):
        rows = {r["path"]: r for r in results["cases"] if r["B"] == B}
        swept = min(((r["us"], p) for p, r in rows.items() if p.startswith("moe_decode")), default=(nan, ""))
        today, fused = rows.get("today", {}), rows.get("moe_decode", {})
        print(f"| {B} | {today.get('us', nan):.1f} | {fused.get('us', nan):.1f} | {swept[0]:.1f} ({swept[1]}) | "
              f"{fused.get('floor_us', nan):.1f} | {fused.get('pct_floor', nan):.0f}% | "
              f"{max(r['rel_err'] for r in rows.values()):.1e} |")
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
    batches = [int(b) for b in args.batches.split(",")][: 2 if args.smoke else None]
    n = 1 if args.smoke else CALLS
    inputs = {B: _inputs(geom, layers, B, bw, n) for B in batches}
    # every B's two paths first, then the sweeps (--smoke: one swept configuration per B)
    sms = _num_sms(layers[0][0].device)
    for sweep in (False, True):
        for B in batches:
            paths = _paths(geom, B, sweep)
            if sweep and args.smoke:
                paths = dict(list(paths.items())[:1])
            part = f"B={B}{' sweep' if sweep else ''}"
            print(f"{part}: default {pick_config(B, H, I, sms)}; floor {inputs[B]['floor_us']:.1f} us", flush=True)
            run.part(part, bench_batch, run, layers, B, inputs[B], paths)
    print_summary(run.results)
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
