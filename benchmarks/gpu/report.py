"""The short table the GPU benchmark prints last, from its raw results dict."""

from __future__ import annotations

from peers_report import print_peers
from runlog import print_problems

HF_ANCHORS = ("9B decode B=1 53.2 ms, B=8 67.2 ms/step, prefill 2048 87 ms, 8192 287 ms; 0.8B decode B=1 48.6 ms, "
              "B=8 54.9 ms/step, prefill 2048 49 ms, 8192 67 ms; 35B-A3B decode B=1 119.7 ms, B=8 108.1 ms/step, "
              "prefill 2048 170 ms")


def _f(x, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def print_table(r: dict) -> None:
    bw = r.get("bandwidth") or {}
    print("\n" + "=" * 100)
    print(f"ninfer fast path on {r.get('device')} (torch {r.get('torch')}); HBM copy {_f(bw.get('copy_tb_s'))} TB/s, "
          f"read {_f(bw.get('read_tb_s'))} TB/s; wall {_f(r.get('wall_s'), '{:.0f}')} s")
    print(f"GPU tests: {r.get('pytest')}")
    print("decode (random bf16 weights; ms per step of B tokens; floor = bytes one step must move / copy bandwidth;"
          " floor % = floor / best measured)")
    print(f"{'model':8} {'ctx':>5} {'B':>2} {'eager ms':>9} {'graph ms':>9} {'ms/token':>9} {'tok/s':>8} "
          f"{'floor ms':>9} {'floor/tok':>9} {'floor %':>8} {'finite':>6}")
    for name, m in r.get("models", {}).items():
        for d in m.get("decode", []):
            g = d.get("graph_ms")
            best = g if g is not None else d.get("eager_ms")
            pct = 100 * d["floor_ms"] / best if best else None
            per_token = best / d["B"] if best else None
            tok_s = d["B"] * 1e3 / best if best else None
            print(f"{name:8} {d['ctx']:>5} {d['B']:>2} {_f(d.get('eager_ms')):>9} {_f(g):>9} "
                  f"{_f(per_token, '{:.3f}'):>9} {_f(tok_s, '{:.0f}'):>8} {_f(d['floor_ms'], '{:.3f}'):>9} "
                  f"{_f(d['floor_ms'] / d['B'], '{:.3f}'):>9} {_f(pct, '{:.0f}%'):>8} {str(d.get('finite', '-')):>6}")
    print("prefill (one sequence, one piece)")
    for name, m in r.get("models", {}).items():
        for p in m.get("prefill", []):
            print(f"  {name:8} T={p['T']:>5}: {p['ms']:8.1f} ms  {p['tok_s']:>9.0f} tok/s  finite={p['finite']}")
    for name, m in r.get("models", {}).items():
        par = m.get("parity")
        if par:
            errs = ", ".join(f"{e:.2e}" for e in par["rel_rms"])
            print(f"parity {name} (fast bf16{' + graphs' if par['graphs'] else ''} vs reference fp32, prefill "
                  f"{par['prompt_len']} then {par['steps']} decodes): rel RMS [{errs}], top-1 agree "
                  f"{sum(par['top1_agree'])}/{len(par['top1_agree'])}")
    print(f"HF transformers + fla on an H200 (perf-anchors.md section 9): {HF_ANCHORS}")
    print("memory")
    for name, m in r.get("models", {}).items():
        gib = lambda k: _f((m.get(k) or 0) / 2**30)  # noqa: E731
        print(f"  {name:8} weights {gib('weight_bytes')} GiB, plan {gib('plan_bytes')} GiB, peak allocated "
              f"{gib('peak_allocated_bytes')} GiB, peak reserved {gib('peak_reserved_bytes')} GiB, "
              f"transient peak {gib('transient_peak_bytes')} GiB vs planned workspace "
              f"{gib('workspace_planned_bytes')} GiB, graph capture {_f(m.get('graph_capture_s'), '{:.1f}')} s, "
              f"build {_f(m.get('build_s'), '{:.1f}')} s")
    print_problems(r)


def load_results(out_dir: str | None, name: str) -> dict | None:
    """A benchmark's raw JSON from its output folder or one of its part folders (`run.sh a:s b:s`), or None."""
    import json
    from pathlib import Path

    if not out_dir:
        return None
    found = [p for p in [Path(out_dir) / name, *sorted(Path(out_dir).glob(f"*/{name}"))] if p.is_file()]
    return json.loads(found[0].read_text()) if found else None


def print_hf_table(r: dict) -> None:
    """bench_hf.py's results: transformers (+ fla when it imported) on the same shapes, this run."""
    print("\n" + "=" * 100)
    fla = r.get("fla") or f"not installed ({r.get('fla_error', 'import failed')})"
    print(f"HF transformers {r.get('transformers')} on {r.get('device')} (torch {r.get('torch')}), fla {fla}; "
          f"wall {_f(r.get('wall_s'), '{:.0f}')} s")
    for name, m in r.get("models", {}).items():
        k = m.get("kernels") or {}
        gdn = ", ".join(f"{f.replace('torch_', '')} -> {k[f].split('.')[0]}" for f in k
                        if f.endswith(("gated_delta_rule", "conv1d_fn", "conv1d_update")))
        print(f"{name:8} {(m.get('params') or 0) / 1e9:.2f}B params, build {_f(m.get('build_s'), '{:.1f}')} s, "
              f"attention {k.get('attn_implementation')}, experts {k.get('experts_implementation')}; {gdn}")
        for d in m.get("decode", []):
            print(f"  decode B={d['B']}: {d['step_ms']:8.2f} ms/step ({d['ms_per_token']:.2f} ms/token, "
                  f"{d['tok_s']:.0f} tok/s) over {d['new_tokens']} tokens after a {d['prompt']}-token prompt; "
                  f"generate(1) {d['first_token_s'] * 1e3:.0f} ms")
        for p in m.get("prefill", []):
            print(f"  prefill T={p['T']:>5}: {p['ms']:8.1f} ms {p['tok_s']:>9.0f} tok/s  finite={p['finite']}")
        if m.get("peak_allocated_bytes"):
            print(f"  peak allocated {m['peak_allocated_bytes'] / 2**30:.2f} GiB")
    print_problems(r)


def print_side_by_side(ours: dict, hf: dict) -> None:
    """HF(+fla) vs ninfer's fast path, from the same run: decode per step at the 512-token context (ninfer: graph
    replay at context 512; HF: generate after a 512-token prompt) and one-piece prefill."""
    fla = "HF+fla" if hf.get("fla") else "HF (torch fallbacks)"
    print("\n" + "=" * 100)
    print(f"{fla} vs ninfer, same GPU run (ms; x = HF time / ninfer time)")
    print(f"{'model':8} {'case':16} {fla:>20} {'ninfer':>10} {'x':>8}")
    for name, h in hf.get("models", {}).items():
        n = ours.get("models", {}).get(name)
        if not n:
            continue
        for d in h.get("decode", []):
            mine = [r for r in n.get("decode", []) if r["B"] == d["B"] and r["ctx"] == d["prompt"]]
            best = (mine[0].get("graph_ms") or mine[0].get("eager_ms")) if mine else None
            x = d["step_ms"] / best if best else None
            print(f"{name:8} {'decode B=' + str(d['B']):16} {d['step_ms']:>20.2f} {_f(best):>10} "
                  f"{_f(x, '{:.1f}x'):>8}")
        for p in h.get("prefill", []):
            mine = [r for r in n.get("prefill", []) if r["T"] == p["T"]]
            best = mine[0]["ms"] if mine else None
            x = p["ms"] / best if best else None
            print(f"{name:8} {'prefill T=' + str(p['T']):16} {p['ms']:>20.1f} {_f(best, '{:.1f}'):>10} "
                  f"{_f(x, '{:.1f}x'):>8}")
    print("=" * 100)


def main(argv: list[str] | None = None) -> int:
    """python benchmarks/gpu/report.py [--peers] DIR: the tables of the JSON files a GPU run left in DIR (or in DIR's
    part folders), with the peers table when the Engine's and a peer's results are there (--peers: that one only)."""
    import sys

    args = list(argv if argv is not None else sys.argv[1:])
    peers_only = "--peers" in args
    out_dir = next((a for a in args if a != "--peers"), None)
    ours, hf = load_results(out_dir, "bench_fast.json"), load_results(out_dir, "bench_hf.json")
    engine, llamacpp = load_results(out_dir, "bench_engine.json"), load_results(out_dir, "bench_llamacpp.json")
    if ours is not None and not peers_only:
        print_table(ours)
    if hf is not None and not peers_only:
        print_hf_table(hf)
    if ours is not None and hf is not None and not peers_only:
        print_side_by_side(ours, hf)
    if engine is not None and (llamacpp is not None or hf is not None):
        print_peers(engine, llamacpp, hf)
    return 0 if (ours or hf or engine) else 1


if __name__ == "__main__":
    raise SystemExit(main())
