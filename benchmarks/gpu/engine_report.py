"""bench_engine.py's report: the table of one run's results (decode, idle between steps, prefill, the prefix hit
and its phases, the ITL under a prefill beside decoding rows, long contexts, memory), then the run's problems."""

from __future__ import annotations

from runlog import print_problems


def fmt(x, form: str = "{:.2f}") -> str:
    """A number in `form`, or "-" where a part did not record it."""
    return "-" if x is None else form.format(x)


def print_table(r: dict, lanes: int) -> None:
    print("\n" + "=" * 100)
    print(f"ninfer Engine + fast Program on {r.get('device')} (torch {r.get('torch')}), random bf16 weights, "
          f"{lanes} lanes; wall {fmt(r.get('wall_s'), '{:.0f}')} s")
    print(f"{'model':8} {'ctx':>5} {'B':>2} {'step ms':>8} {'ms/token':>9} {'tok/s':>7} {'TPOT ms':>8}")
    for name, m in r.get("models", {}).items():
        for d in m.get("decode", []):
            print(f"{name:8} {d['ctx']:>5} {d['B']:>2} {d['step_ms']:8.2f} {d['step_ms'] / d['B']:9.3f} "
                  f"{d['tok_s']:7.0f} {d['tpot_ms']:8.2f}")
    for name, m in r.get("models", {}).items():
        greedy = {(d["ctx"], d["B"]): d["step_ms"] for d in m.get("decode", [])}
        for d in m.get("sampled", []):
            base = greedy.get((d["ctx"], d["B"]))
            extra = "" if base is None else f" (greedy {base:.2f}: {d['step_ms'] - base:+.2f})"
            print(f"  {name:8} B={d['B']} ctx {d['ctx']} sampled at {d['sampling']}: step {d['step_ms']:.2f} ms{extra}")
    for name, m in r.get("models", {}).items():
        for d in m.get("idle", []):
            unit = "device" if d["device_events"] else "host (no CUDA)"
            print(f"  {name:8} B={d['B']} async {'on ' if d['async'] else 'off'}: step {d['step_ms']:.3f} ms, idle "
                  f"between steps ({unit}) median {d['gap_us_median']:.1f} us, p90 {d['gap_us_p90']:.1f}, max "
                  f"{d['gap_us_max']:.1f} over {d['steps']} steps (target <= 30 us)")
    for name, m in r.get("models", {}).items():
        for p in m.get("prefill", []):
            print(f"  {name:8} prefill T={p['T']:>5}: TTFT {p['ttft_ms']:8.1f} ms  {p['tok_s']:>8.0f} tok/s")
        print_costs(name, m.get("prefill_costs"))
        h = m.get("prefix_hit")
        if h:
            suffix = h["prompt"] - h["reused"]
            graphed = any(suffix <= b for b in m.get("prefill_graph_buckets", []))
            print(f"  {name:8} TTFT {h['prompt']} tokens with a {h['prefix']}-token checkpoint hit: "
                  f"{h['ttft_ms']:.1f} ms (reused {h['reused']}; the {suffix}-token suffix "
                  f"{'fits a prefill graph bucket' if graphed else 'runs eagerly'}); cold {h['cold_ttft_ms']:.1f} ms")
            if "suffix_cold_ttft_ms" in h:
                ratio = h["hit_vs_suffix_cold"]
                print(f"  {name:8} the hit against a cold {h['prompt'] - h['prefix']}-token prompt "
                      f"({h['suffix_cold_ttft_ms']:.1f} ms): {ratio:.2f}x (target <= 1.3: "
                      f"{'PASS' if ratio <= 1.3 else 'FAIL'})")
            print_phases(h)
        print_itl(name, m.get("itl"))
        print_itl(name, m.get("itl_alternating"))
        lg = m.get("long")
        if lg:
            print(f"  {name:8} {lg['context']}-token sequences: pools hold {lg['fit_by_pages']} by KV pages, "
                  f"{lg['fit_by_slots']} by state slots; {lg.get('peak_active', '-')} active at once (lanes "
                  f"{lg['lanes']}), step {fmt(lg.get('step_ms'))} ms at B={lg['lanes']}, wall "
                  f"{fmt(lg.get('wall_s'), '{:.1f}')} s")
        gib = lambda k: fmt((m.get(k) or 0) / 2**30)  # noqa: E731
        print(f"  {name:8} memory: weights {gib('weight_bytes')} GiB, KV {gib('kv_bytes')} GiB, GDN state "
              f"{gib('state_bytes')} GiB, plan {gib('plan_bytes')} GiB, peak allocated "
              f"{gib('peak_allocated_bytes')} GiB, build {fmt(m.get('build_s'), '{:.1f}')} s; op table "
              f"{m.get('kernels')}, PDL {'on' if m.get('pdl') else 'off'}")
    print_problems(r)


def print_phases(h: dict) -> None:
    if "phases" not in h:
        return
    print(f"    phases of a hit, each synchronized (TTFT {h['phased_ttft_ms']:.1f} ms, reused {h['phased_reused']}); "
          f"nested: the store's copies inside advance and prefill, model prefill and first draw inside prefill")
    for name, p in h["phases"].items():
        dev = f", device {p['device_ms']:7.2f} ms" if "device_ms" in p else ""
        print(f"      {name:14} {p['calls']:>3} calls  host {p['host_ms']:7.2f} ms{dev}")


def print_costs(name: str, c: dict | None) -> None:
    """The measured PrefillCosts: an eager piece's fixed cost (host launches) against a graphed one's."""
    if not c:
        return
    if not c["measured"]:
        print(f"  {name:8} prefill costs: not measured (generic fallback)")
        return
    buckets = ", ".join(f"{b}: {s * 1e3:.2f}" for b, s in zip(c["graph_buckets"], c["graph_piece_s"])) or "none"
    print(f"  {name:8} prefill costs measured at start: eager piece fixed {c['fixed_s'] * 1e3:.2f} ms + "
          f"{c['token_s'] * 1e6:.2f} us/token (floor {c['floor_s'] * 1e3:.2f} ms); graphed fixed "
          f"{c['graph_fixed_s'] * 1e3:.3f} ms, bucket ms {buckets}")


def print_itl(name: str, d: dict | None) -> None:
    if not d:
        return
    verdict = lambda ok: "PASS" if ok else "FAIL"  # noqa: E731
    sizes = sorted(set(d["chunks"]))
    how = "riding in the decode rounds" if d.get("mixed") else "alternating with the decode rounds"
    print(f"  {name:8} ITL while a {d['prompt']}-token prompt prefills ({how}) beside {d['decoding']} decoding rows: p99 "
          f"{d['p99_ms']:.2f} ms, max {d['max_ms']:.2f}, median {d.get('median_ms', float('nan')):.2f}, plain step "
          f"{d['plain_step_ms']:.2f} ms: {d['ratio']:.2f}x "
          f"(target <= {d['target']}x) {verdict(d['itl_pass'])}; {len(d['chunks'])} chunks of {sizes[0]}.."
          f"{sizes[-1]} tokens; its prefill {d['prefill_tok_s']:.0f} tok/s against {d['alone_tok_s']:.0f} alone "
          f"({fmt(d['throughput_share'])}, target >= 0.95) {verdict(d['throughput_pass'])}; graphed fixed cost "
          f"{d['costs'].get('graph_fixed_s', 0.0) * 1e3:.3f} ms a piece (eager {d['costs']['fixed_s'] * 1e3:.2f})")
