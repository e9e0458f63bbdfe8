"""The GPU benchmark scripts run rarely (device time is scarce), so CI runs each one's --smoke mode: the same code
paths on a tiny shape on the CPU. Only that they finish and record sane numbers is checked, never a speed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

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
    assert tiny["prefix_hit"]["reused"] == tiny["prefix_hit"]["prefix"]  # the retained checkpoint was hit
    assert tiny["prefix_hit"]["cold_reused"] == 0
    assert tiny["long"]["peak_active"] == tiny["long"]["lanes"]  # every long sequence ran at once


def test_bench_fast_smoke(tmp_path):
    tiny = _smoke("bench_fast.py", tmp_path)["models"]["tiny"]
    assert tiny["decode"] and all(_positive(d["eager_ms"]) and d["finite"] for d in tiny["decode"])
    assert tiny["prefill"] and all(p["finite"] for p in tiny["prefill"])
    assert all(e < 2e-2 for e in tiny["parity"]["rel_rms"])


def test_bench_hf_smoke(tmp_path):
    models = _smoke("bench_hf.py", tmp_path)["models"]
    assert set(models) == {"tiny", "tiny-moe"}
    assert all(m["prefill"] for m in models.values())
