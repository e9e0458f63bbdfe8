"""The short table the GPU benchmark prints last, from its raw results dict."""

from __future__ import annotations

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
    for what in r.get("skipped", []):
        print(f"SKIPPED {what}")
    for part, err in r.get("errors", {}).items():
        print(f"ERROR {part}: {err[:300]}")
    print("=" * 100)
