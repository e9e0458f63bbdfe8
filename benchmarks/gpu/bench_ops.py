"""Per-op micro-benchmark at real Qwen3.5 shapes on one GPU, about 30 s with a cold Triton cache (the attention
autotune compiles four tiles): the GDN prefill conv, prefill attention, the chunked GDN (with a per-kernel
breakdown from torch.profiler, and fla's chunk_gated_delta_rule next to it when fla imports) and the GDN decode
step and the speculative acceptance kernels (both replayed from a CUDA graph). Each row prints the time (triton.testing.do_bench mean), the achieved TB/s or
TFLOP/s and the number measured on the H200 before the current kernels (torch.profiler, kernel time per layer).

    python benchmarks/gpu/bench_ops.py [--ops conv,attn,chunk,decode,spec] [--all]   # OUT=dir: also bench_ops.json
    python benchmarks/gpu/bench_ops.py --smoke                                  # the same code on a CPU, tiny T

--all adds the 0.8B chunked GDN (HV=16: its own compiles, ~10 s more).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module imports triton

import torch  # noqa: E402
from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

from ninfer.fast.ops.gdn_chunk import gdn_chunk, gdn_conv_prefill  # noqa: E402
from ninfer.fast.ops.gdn_decode import gdn_decode  # noqa: E402
from ninfer.fast.ops.prefill_attention import prefill_attention  # noqa: E402
from ninfer.fast.ops.prefill_attention.triton import _prefill_tuned  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
BF16 = dict(device=DEV, dtype=torch.float32 if SMOKE else torch.bfloat16)  # the interpreter's bf16 dots are wrong
HK, DK, DV = 16, 128, 128  # GDN key heads and head dims of every Qwen3.5 size
T_LONG, T_SHORT = (64, 32) if SMOKE else (8192, 2048)
ROWS: list[dict] = []


def _ms(fn, graph: bool = False) -> float:
    """Milliseconds per call: do_bench (or replayed from a CUDA graph); one timed host call in --smoke."""
    if SMOKE:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return do_bench_cudagraph(fn) if graph else do_bench(fn)


def _row(op: str, shape: str, us: float, rate: str, before: str) -> None:
    ROWS.append(dict(op=op, shape=shape, us=round(us, 1), rate=rate, before=before))
    print(f"{op:<22} {shape:<34} {us:>9.1f} us  {rate:<16} before: {before}", flush=True)


def _gdn_proj(T: int, HV: int) -> tuple[torch.Tensor, int]:
    """in_proj's fused output [T, qkv | z | b | a], as the model slices it; returns (proj, conv_dim)."""
    C = 2 * HK * DK + HV * DV
    return 0.5 * torch.randn(T, C + HV * DV + 2 * HV, **BF16), C


def bench_conv(label: str, T: int, HV: int, before: str) -> None:
    proj, C = _gdn_proj(T, HV)
    m = proj[:, :C]
    window = torch.randn(C, 3, **BF16)
    weight = 0.5 * torch.randn(C, 1, 4, **BF16)
    ms = _ms(lambda: gdn_conv_prefill(m, window, weight, window_out=window))
    moved = 2 * T * C * 2  # read m, write out (bf16)
    _row("gdn_conv_prefill", f"{label} T={T} C={C}", ms * 1e3, f"{moved / ms / 1e9:.2f} TB/s", before)


def bench_attention(T: int, before: str, nh: int = 16, nkv: int = 4, d: int = 256, page: int = 16) -> None:
    pages = T // page
    k_pages = torch.randn(pages, page, nkv, d, **BF16)
    v_pages = torch.randn(pages, page, nkv, d, **BF16)
    table = torch.randperm(pages, device=DEV, dtype=torch.int32)[None]
    cu = torch.tensor([0, T], device=DEV, dtype=torch.int32)
    prefix = torch.zeros(1, device=DEV, dtype=torch.int32)
    q = torch.randn(T, nh, d, **BF16)
    ms = _ms(lambda: prefill_attention(q, k_pages, v_pages, table, cu, prefix, T))
    flops = 4 * d * nh * T * (T + 1) / 2  # causal QK^T + PV
    cfg = getattr(_prefill_tuned, "best_config", None)
    tile = f"BM={cfg.kwargs['BM']} BN={cfg.kwargs['BN']} w{cfg.num_warps} s{cfg.num_stages}" if cfg else "fixed"
    _row("prefill_attention", f"9B T={T} 16/4 heads d=256", ms * 1e3, f"{flops / ms / 1e9:.0f} TFLOP/s", before)
    print(f"{'':<22} autotuned tile: {tile}")


def _kernel_us(fn, iters: int = 5) -> dict[str, float]:
    """Per-kernel device time (us per call) of fn from torch.profiler."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = {}
    for evt in prof.key_averages():
        t = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0)
        if t > 0:
            out[evt.key] = t / iters
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def bench_chunk(label: str, T: int, HV: int, before: str) -> None:
    proj, C = _gdn_proj(T, HV)
    qkv = torch.nn.functional.silu(proj[:, :C].float()).to(torch.bfloat16)  # post-conv, contiguous like the conv out
    z, b, a = proj[:, C:C + HV * DV], proj[:, C + HV * DV:C + HV * DV + HV], proj[:, -HV:]
    A_log = torch.empty(HV, device=DEV).uniform_(0, 2.7)
    dt_bias = torch.randn(HV, device=DEV)
    norm_w = torch.ones(DV, **BF16)
    s0 = torch.zeros(HV, DK, DV, device=DEV)
    fn = lambda: gdn_chunk(qkv, z, a, b, A_log, dt_bias, norm_w, s0, HK, DK, DV)  # noqa: E731
    ms = _ms(fn)
    _row("gdn_chunk", f"{label} T={T} HV={HV} dk=dv=128", ms * 1e3, "", before)
    if not SMOKE:
        for name, us in _kernel_us(fn).items():
            print(f"{'':<22}   {name[:60]:<60} {us:>8.1f} us")
    _fla_chunk(label, T, HV, qkv, b, a, A_log, dt_bias)


def _fla_chunk(label, T, HV, qkv, b, a, A_log, dt_bias) -> None:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # fla is optional (a carried wheel)
        print(f"{'':<22} fla not importable ({type(e).__name__}): no fla row")
        return
    q, k, v = torch.split(qkv, [HK * DK, HK * DK, HV * DV], dim=-1)
    rep = HV // HK
    q = q.reshape(1, T, HK, DK).repeat_interleave(rep, 2).contiguous()
    k = k.reshape(1, T, HK, DK).repeat_interleave(rep, 2).contiguous()
    v = v.reshape(1, T, HV, DV).contiguous()
    g = (-A_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias)).reshape(1, T, HV)
    beta = torch.sigmoid(b.float()).to(torch.bfloat16).reshape(1, T, HV)
    fn = lambda: chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,  # noqa: E731
                                        use_qk_l2norm_in_kernel=True)
    _row("fla chunk_gated_delta", f"{label} T={T} HV={HV} (no norm)", _ms(fn) * 1e3, "", "fla 0.95 ms (9B)")


def bench_decode(B: int, before: str, HV: int = 32) -> None:
    proj, C = _gdn_proj(B, HV)
    mixed, z = proj[:, :C], proj[:, C:C + HV * DV]
    b, a = proj[:, C + HV * DV:C + HV * DV + HV], proj[:, -HV:]
    conv_state = torch.randn(B + 1, C, 3, **BF16)
    conv_w = 0.5 * torch.randn(C, 1, 4, **BF16)
    ssm = 0.1 * torch.randn(B + 1, HV, DK, DV, device=DEV)
    slots = torch.randperm(B + 1, device=DEV, dtype=torch.int32)[:B]
    A_log = torch.empty(HV, device=DEV).uniform_(0, 2.7)
    dt_bias, norm_w = torch.randn(HV, device=DEV), torch.ones(DV, **BF16)
    ms = _ms(lambda: gdn_decode(mixed, z, a, b, conv_state, conv_w, A_log, dt_bias, norm_w, ssm, slots, HK, DK, DV),
             graph=True)
    moved = 2 * B * HV * DK * DV * 4  # S read + written, fp32
    _row("gdn_decode (graph)", f"9B B={B} HV={HV}", ms * 1e3, f"{moved / ms / 1e9:.2f} TB/s", before)


def bench_spec_accept(B: int, k: int, greedy: bool) -> None:
    """The speculative acceptance kernels over the real vocabulary, captured and replayed in a CUDA graph."""
    from ninfer.fast.ops.sample import layout as SL
    from ninfer.fast.ops.spec_accept import SpecAcceptWorkspace, spec_accept

    V = 1000 if SMOKE else 248320
    z = 3 * torch.randn(B, k + 1, V, device=DEV)
    zq = None if greedy else z[:, :k] + torch.randn(B, k, V, device=DEV)
    drafts = torch.randint(0, V, (B, k), device=DEV)
    num = torch.full((B,), k, dtype=torch.int32, device=DEV)
    ip = torch.zeros(B, SL.INT_COLUMNS, dtype=torch.int64, device=DEV)
    ip[:, SL.SEED], ip[:, SL.POSITION] = torch.arange(B, device=DEV) + 11, 1000
    ip[:, SL.FLAGS] = SL.GREEDY if greedy else 0
    ws = SpecAcceptWorkspace.allocate(B, k, V, DEV)
    out = torch.empty(B, 3 + k, dtype=torch.int32, device=DEV)
    ms = _ms(lambda: spec_accept(z, drafts, num, ip, zq, workspace=ws, out=out), graph=True)
    read = z.numel() * 4 * (1 if greedy else 2) + (0 if greedy else zq.numel() * 4 * 2)  # stats + residual passes
    _row("spec_accept (graph)", f"B={B} k={k} V={V} {'greedy' if greedy else 'sampled'}", ms * 1e3,
         f"{read / ms / 1e9:.2f} TB/s", "new")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="conv,attn,chunk,decode,spec")
    ap.add_argument("--all", action="store_true", help="also the 0.8B chunked GDN")
    ap.add_argument("--smoke", action="store_true", help="run on a CPU through the Triton interpreter, tiny T")
    args = ap.parse_args()
    ops = set(args.ops.split(","))
    t0 = time.time()
    torch.manual_seed(0)
    print(f"{'CPU smoke run' if SMOKE else torch.cuda.get_device_name()}: time per call", flush=True)
    if "conv" in ops:
        bench_conv("9B", T_LONG, 32, "254 us (1.06 TB/s)")
        bench_conv("0.8B", T_LONG, 16, "178 us")
    if "attn" in ops:
        bench_attention(T_LONG, "2.1 ms profiled / 1.86 ms (296 TFLOP/s)")
        bench_attention(T_SHORT, "177 TFLOP/s")
    if "chunk" in ops:
        bench_chunk("9B", T_LONG, 32, "1.44 ms (state 583, prep 462, output 396 us)")
        if args.all:
            bench_chunk("0.8B", T_LONG, 16, "state 478 us")
    if "decode" in ops:
        bench_decode(1, "recurrent 6.6 + conv ~2 us, 2 launches")
        bench_decode(2 if SMOKE else 8, "recurrent 15.5 + conv ~2 us, 2 launches")
    if "spec" in ops:
        for B, greedy in ((1, True), (8, True), (8, False)):
            bench_spec_accept(B, 3, greedy)
    print(f"done in {time.time() - t0:.1f} s")
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "bench_ops.json"), "w") as f:
            json.dump(ROWS, f, indent=1)


if __name__ == "__main__":
    main()
