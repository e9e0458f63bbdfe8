"""The GPU benchmark scripts run rarely (device time is scarce), so CI runs each one's --smoke mode: the same code
paths on a tiny shape on the CPU. Only that they finish and record sane numbers is checked, never a speed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _smoke(script: str, tmp_path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / script), "--smoke", "--out",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / script.replace(".py", ".json")).read_text())
    assert results["errors"] == {}, results["errors"]
    assert results["skipped"] == []
    return results


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_bench_engine_smoke(tmp_path):
    tiny = _smoke("bench_engine.py", tmp_path)["models"]["tiny"]
    assert {(d["ctx"], d["B"]) for d in tiny["decode"]} == {(16, 1), (16, 2), (40, 1), (40, 2)}
    assert all(_positive(d["step_ms"]) for d in tiny["decode"])
    # each sampling the sampler's variants serve, at B = 2 and the first context
    assert [(d["sampling"], d["ctx"], d["B"]) for d in tiny["sampled"]] == [
        ("top_k 20 top_p 0.95", 16, 2), ("top_p 0.95", 16, 2), ("temperature 0.6", 16, 2)]
    assert all(_positive(d["step_ms"]) for d in tiny["sampled"])
    assert tiny["prefix_hit"]["reused"] == tiny["prefix_hit"]["prefix"]  # the retained checkpoint was hit
    assert tiny["prefix_hit"]["cold_reused"] == 0
    assert _positive(tiny["prefix_hit"]["suffix_cold_ttft_ms"]) and _positive(tiny["prefix_hit"]["hit_vs_suffix_cold"])
    phases = tiny["prefix_hit"]["phases"]  # the timed hit: its transitions, the suffix prefill and its first draw
    assert tiny["prefix_hit"]["phased_reused"] == 64 and phases["model prefill"]["calls"] == 1
    assert all(_positive(phases[p]["host_ms"]) for p in ("advance", "prefill", "model prefill", "first draw"))
    itl = tiny["itl"]  # no measured costs on the CPU: one fixed chunk covers the 100-token prompt
    assert itl["chunks"] == [100] and itl["gaps"] >= itl["decoding"] and not itl["costs"]["measured"]
    assert all(_positive(itl[k]) for k in ("plain_step_ms", "p99_ms", "prefill_tok_s", "alone_tok_s"))
    # as served the chunk rode in a decode round; then the same with the chunks alternating with the rounds
    assert itl["mixed"] and not tiny["itl_alternating"]["mixed"] and tiny["itl_alternating"]["chunks"] == [100]
    assert tiny["long"]["peak_active"] == tiny["long"]["lanes"]  # every long sequence ran at once
    # the prefill graphs' bucket (the 64-token piece) and the costs the report prints (not measured on the CPU)
    assert tiny["prefill_graph_buckets"] == [64] and tiny["prefill_costs"]["graph_buckets"] == []
    idle = {(d["B"], d["async"]): d for d in tiny["idle"]}
    assert set(idle) == {(1, False), (2, False), (1, True), (2, True)}
    assert all(d["steps"] >= 2 and d["gap_us_median"] >= 0 and _positive(d["step_ms"]) for d in idle.values())


def test_bench_fast_smoke(tmp_path):
    tiny = _smoke("bench_fast.py", tmp_path)["models"]["tiny"]
    assert tiny["decode"] and all(_positive(d["eager_ms"]) and d["finite"] for d in tiny["decode"])
    assert tiny["prefill"] and all(p["finite"] for p in tiny["prefill"])
    assert all(e < 2e-2 for e in tiny["parity"]["rel_rms"])


def test_bench_moe_smoke(tmp_path):
    # both paths and a swept configuration at B = 1 and 2, each checked against moe_decode_naive inside the run
    cases = _smoke("bench_moe.py", tmp_path)["cases"]
    assert {(c["B"], c["path"]) for c in cases} >= {(B, p) for B in (1, 2) for p in ("today", "moe_decode")}
    assert len(cases) == 6 and all(_positive(c["us"]) for c in cases)


def test_bench_hf_smoke(tmp_path):
    models = _smoke("bench_hf.py", tmp_path)["models"]
    assert set(models) == {"tiny", "tiny-moe"}
    assert all(m["prefill"] for m in models.values())


def _check_spec(results: dict) -> None:
    tiny = results["models"]["tiny"]
    k = results["k"]
    assert {(r["B"], r["L"]) for r in tiny["spec"]} == {(B, L) for B in (1, 2) for L in range(1, k + 2)}
    for r in tiny["spec"]:
        # fp32 on the CPU: the precomputed continuation is followed exactly, so every round emits the forced L
        assert r["followed"] == 1.0 and r["tokens_per_step"] == r["L"], r
        assert _positive(r["step_ms"]) and _positive(r["draft_ms"]) and r["draft_ms"] < r["synced_step_ms"]
        # the round's phases: what a GPU run needs to tell which part remains
        assert _positive(r["verify_ms"]) and "host_ms" in r and "accept_ms" in r
        # a cut block replays its kept tokens on the reference Program; the fast one takes the state from its step
        # slots and replays nothing. The replay is part of the commit.
        assert (r["replay_ms"] > 0) == (results["program"] == "reference" and r["L"] < k + 1), r
        assert _positive(r["commit_ms"]) and r["commit_ms"] >= r["replay_ms"], r
    assert all(_positive(a["step_ms"]) and a["tokens_per_step"] == 1 for a in tiny["ar"])
    assert set(tiny["targets"]["pass"]) == {"verify_ratio", "speedup", "draft_share"}
    assert tiny["projected"] and all(1 < p["length_at_k"] <= k + 1 and _positive(p["projected_tok_s"])
                                     for p in tiny["projected"])


def test_bench_spec_smoke_reference(tmp_path):
    _check_spec(_smoke("bench_spec.py", tmp_path))


def test_bench_spec_smoke_fast(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "bench_spec.py"), "--smoke",
                           "--program", "fast", "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "bench_spec.json").read_text())
    assert results["errors"] == {} and results["program"] == "fast"
    _check_spec(results)
    # the verify graphs' own times: nothing is captured on the CPU, the same body runs eagerly
    graphs = results["models"]["tiny"]["round_graphs"]
    drafts = [f"draft ({v})" for v in ("greedy", "greedy+lean", "sort")]
    assert [(r["B"], r["pass"]) for r in graphs] == [(1, "verify"), (2, "verify"), (1, "replay")] + \
        [(B, d) for B in (1, 2) for d in drafts]
    assert all(r["graph_ms"] is None and _positive(r["eager_ms"]) and r["k"] == 3 for r in graphs)


@pytest.mark.parametrize("program, method", [("fast", "dflash2"), ("reference", "dflash")])
def test_bench_spec_dflash_smoke(tmp_path, program, method):
    """The DFlash mode: a block of 8 (k = 7) at the spread of forced lengths, each met exactly, the drafter pass
    timed, issue 12's targets and the projections computed; with --profile-host, the host profile of the largest B
    at L = 3."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "bench_spec.py"), "--smoke",
                           "--program", program, "--method", method, "--out", str(tmp_path), "--profile-host"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "bench_spec.json").read_text())
    assert results["errors"] == {} and results["skipped"] == [] and results["method"] == method
    tiny = results["models"]["tiny"]
    assert {(r["B"], r["k"], r["L"]) for r in tiny["spec"]} == {(B, 7, L) for B in (1, 2) for L in (1, 3, 5, 8)}
    for r in tiny["spec"]:
        assert r["followed"] == 1.0 and r["tokens_per_step"] == r["L"], r
        assert _positive(r["step_ms"]) and _positive(r["draft_ms"]) and r["draft_ms"] < r["synced_step_ms"]
        # the round's phases: what a GPU run needs to tell which part remains
        assert _positive(r["verify_ms"]) and "host_ms" in r and "accept_ms" in r
        # a cut block (L < 8) replays on the reference Program; the fast one's plan keeps step slots at block 8
        assert (r["replay_ms"] > 0) == (program == "reference" and r["L"] < 8), r
        assert _positive(r["commit_ms"]) and r["commit_ms"] >= r["replay_ms"], r
    t = tiny["dflash_targets"]["7"]
    assert _positive(t["values"]["draft_share_of_ar"]) and _positive(t["values"]["speedup"])
    assert t["values"]["b8_ratio"] is None and not t["applies"]  # no B = 8 in the smoke run
    assert {p["B"] for p in tiny["projected"]} == {1, 2} and all(_positive(p["projected_tok_s"])
                                                                 for p in tiny["projected"])
    assert "block 8 targets" in done.stdout and "PROJECTED block 8" in done.stdout
    [profile] = tiny["host_profile"]
    assert (profile["k"], profile["B"], profile["L"]) == (7, 2, 3) and profile["rounds"] >= 4
    assert profile["from"] == "the step after every request's first token"  # the prompts' prefill left out
    assert len(profile["top"]) == 25 and all(f["own_ms"] >= 0 and f["calls"] > 0 for f in profile["top"])
    assert "host profile, k=7 B=2 L=3" in done.stdout
    if program == "fast":  # the round's graphs at the block's width, timed alone (eager bodies on the CPU): the
        # verify and replay passes, then the drafter's block pass and draws per variant
        graphs = tiny["round_graphs"]
        drafts = [(B, f"draft ({v})", 7) for B in (1, 2) for v in ("greedy", "greedy+lean", "sort")]
        assert [(r["B"], r["pass"], r["k"]) for r in graphs] == \
            [(1, "verify", 7), (2, "verify", 7), (1, "replay", 7)] + drafts
        assert all(r["graph_ms"] is None and _positive(r["eager_ms"]) for r in graphs)


def test_bench_quant_smoke(tmp_path):
    r = _smoke("bench_quant.py", tmp_path)
    tiny = r["models"]["tiny"]
    assert set(tiny) == {"bf16", "fp8", "q4", "nvfp4"}
    for recipe, m in tiny.items():
        assert {d["B"] for d in m["decode"]} == {1, 2} and all(_positive(d["step_ms"]) for d in m["decode"])
        assert m["prefill"] and all(_positive(p["tok_s"]) for p in m["prefill"])
    # the stored bytes: 4-bit weights below fp8 below bf16 (the tiny model's dense embedding and lm_head included)
    assert tiny["q4"]["weight_bytes"] < tiny["fp8"]["weight_bytes"] < tiny["bf16"]["weight_bytes"]
    assert "int4" in tiny["q4"]["formats"] and "nvfp4" in tiny["nvfp4"]["formats"]
    assert [t["result"] for t in r["targets"]] == ["not run"] * 4


def test_bench_qgemv_smoke(tmp_path):
    # every variant and the first sweep configurations ran and matched qlinear_naive (the script records errors)
    rows = _smoke("bench_qgemv.py", tmp_path)["rows"]
    # M = 2 and 4 time the few-rows FP8 form beside the tl.dot one, and int4's forms
    assert [r["M"] for r in rows] == [1, 2, 4, 8]
    for r in rows:
        assert _positive(r["bf16_us"])
        few = r["M"] in (2, 4)
        for v in ("fp8", "q4") + (("fp8rows",) if few else ("q4_generic", "nvfp4")) + \
                (("fp8row",) if r["M"] == 1 else ()):
            assert _positive(r[f"{v}_best"]["us"]) and _positive(r[f"{v}_bytes"])
        assert ("fp8row_best" in r) == (r["M"] == 1) and ("fp8rows_best" in r) == few and ("nvfp4_best" in r) != few
        assert r["q4_bytes"] < r["fp8_bytes"]


def test_bench_pp_smoke(tmp_path):
    """cpu,cpu stages against one stage: every step and piece timed, both plans the same pages (one budget)."""
    tiny = _smoke("bench_pp.py", tmp_path)["models"]["tiny"]
    one, staged = tiny["one"], tiny["staged"]
    assert staged["layers"] == [2, 2] and one["layers"] == [4]
    assert staged["link_bytes"] > 0 and one["link_bytes"] == 0
    assert [d["B"] for d in staged["decode"]] == [1, 2] and all(_positive(d["step_ms"]) for d in staged["decode"])
    assert all(_positive(r) for r in tiny["decode_ratio"].values()) and _positive(tiny["prefill_ratio"])
    assert staged["kv_pages"] == one["kv_pages"] == 80 and staged["long_fits"] and _positive(staged["long_prefill_s"])


def test_bench_agent_smoke(tmp_path):
    """The agent benchmark through the in-process server: every turn after the first reuses the previous prompt
    (prefilling at most its new tokens plus 64), the reuse survives the unrelated requests, and every target is
    reported with a verdict."""
    results = _smoke("bench_agent.py", tmp_path)
    assert set(results["runs"]) == {"1", "2"}
    for summary in results["runs"].values():
        assert [r["turn"] for r in summary["turns"]] == [1, 2, 3] and summary["failed"] == 0
        assert summary["max_excess_prefill"] <= 64 and all(_positive(r["ttft_ms"]) for r in summary["turns"])
    assert results["reuse"]["failed_unrelated"] == 0 and results["reuse"]["reuse"] > 0.9
    assert len(results["targets"]) == 5 and all(isinstance(t["pass"], bool) for t in results["targets"])
    assert results["build"]["costs"]["measured"] is False  # the CPU reports the generic fallback
    assert results["cache"]["hits"] > 0
    for level in ("1", "2"):  # the probe saw every prefill chunk sized (fixed on the CPU) and timed the demotions
        probe = results["probe"][level]
        assert probe["chunks"].get("fixed", 0) > 0 and probe["chunk_tokens"]["fixed"] > 0
        assert set(probe["copy_s"]) == {"to_host", "to_device"}
    assert sum(p["copies"].get("to_host", 0) for p in results["probe"].values()) <= results["cache"]["demotions"]


def test_bench_llamacpp_reads_the_tools_outputs(tmp_path, monkeypatch):
    """llama.cpp itself needs the device; here stand-in tools print the formats that commit 0c1e57098's
    batched-bench (--output-format jsonl) and llama-bench (-o json) print, and the script's numbers follow."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import bench_llamacpp

    rows = [{"pp": 512, "tg": 64, "pl": b, "t_tg": 0.32 * (1 + b / 8), "speed_tg": 64 * b / (0.32 * (1 + b / 8))}
            for b in bench_llamacpp.BATCHES]
    (tmp_path / "llama-batched-bench").write_text(
        "#!/bin/sh\necho 'main: n_kv_max = 8192'\n" + "".join(f"echo '{json.dumps(r)}'\n" for r in rows))
    (tmp_path / "llama-bench").write_text(
        "#!/bin/sh\ncase \"$*\" in *'-n 128'*) echo '[{\"n_prompt\": 0, \"avg_ts\": 200.0}]';;\n"
        "*) echo '[{\"n_prompt\": 2048, \"avg_ts\": 9000.0}, {\"n_prompt\": 8192, \"avg_ts\": 8000.0}]';; esac\n")
    for tool in tmp_path.iterdir():
        tool.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    monkeypatch.setattr(bench_llamacpp, "gguf", lambda name, timeout: model)
    results = {"commit": "0c1e57098", "models": {}, "errors": {}}
    bench_llamacpp.bench_model(tmp_path, "tiny", results, lambda: 30.0)
    tiny = results["models"]["tiny"]
    assert tiny["decode_512ctx"]["B1"]["step_ms"] == 1000 * rows[0]["t_tg"] / 64
    assert set(tiny["decode_512ctx"]) == {"B1", "B2", "B4", "B8"}
    assert tiny["tg128_ms"] == 5.0 and tiny["prefill_tok_s"] == {"2048": 9000.0, "8192": 8000.0}
    assert not model.exists()  # the GGUF is removed once measured
    bench_llamacpp.print_table(results)


def test_profile_fast_smoke(tmp_path):
    # no CUPTI on the CPU: only the host launch count per step and per layer kind of the tiny model
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "profile_fast.py"), "--smoke", "--out",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    counted = json.loads((tmp_path / "profile_fast.json").read_text())["tiny"]["decode_B2"]["host_launches"]
    assert all(_positive(counted[k]) for k in ("total", "step", "per_gdn_layer", "per_attention_layer"))
    assert "launches per step" in done.stdout


def test_profile_graphs_smoke(tmp_path):
    """Every case the GPU run profiles (prefill bucket 64: the smoke Program's only one; the decode step; the MTP
    round's verify, replay and draft passes) ran its eager body (nothing is captured on the CPU) and tabled it."""
    tiny = _smoke("profile_graphs.py", tmp_path)["models"]["tiny"]
    assert tiny["prefill_graph_buckets"] == [64]
    assert [(c["case"], c["program"]) for c in tiny["cases"]] == [
        ("prefill 64", "plain"), ("decode B=1", "plain"), ("verify B=1", "mtp k=3"), ("replay B=1", "mtp k=3"),
        ("draft (greedy) B=1", "mtp k=3"), ("draft (greedy+lean) B=1", "mtp k=3"), ("draft (sort) B=1", "mtp k=3")]
    for c in tiny["cases"]:
        assert c["profiled"] == "eager body (nothing captured)" and c["graph"] is None, c["case"]
        assert _positive(c["wall_ms"]) and _positive(c["eager_ms"]) and c["replay_device_ms"] is None
        table = c["eager"]
        assert not table["device_kernels"] and _positive(table["launches"]) and table["top"]
        assert _positive(table["span_us"]) and _positive(table["kernel_us"])


def test_bench_serve_smoke(tmp_path):
    """`ninfer bench serve` (the CLI in its own process) against the benchmark's server process over the fast
    Program: every level's requests complete with finite latencies, and the server came up and went down."""
    results = _smoke("bench_serve.py", tmp_path)
    tiny = results["models"]["tiny-vocab"]
    assert _positive(tiny["ready_s"])
    for level in ("1", "2"):
        summary = tiny[level]
        assert summary["completed"] == 2 * int(level) and summary["failed"] == 0
        assert summary["total_output_tokens"] == 4 * summary["completed"]  # ignore_eos pins the output length
        assert all(_positive(summary[f"median_{m}_ms"]) for m in ("ttft", "tpot", "itl", "e2el"))

