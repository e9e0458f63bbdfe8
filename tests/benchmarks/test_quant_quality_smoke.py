"""benchmarks/quant_quality.py --smoke: every recipe converts, runs on the reference model and reports sane numbers
(the quality itself is reported in docs/quantization.md, not gated)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quant_quality_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("quant_quality", ROOT / "benchmarks" / "quant_quality.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--smoke", "--out", str(tmp_path / "q.json")])
    rows = json.loads((tmp_path / "q.json").read_text())["recipes"]
    assert set(rows) == {"bf16", "fp32 (scale)", "fp8", "q4", "q5", "nvfp4"}
    for name, r in rows.items():
        assert math.isfinite(r["rel_rms"]) and 0 <= r["top1_agreement"] <= 1, name
    assert rows["bf16"]["rel_rms"] == 0 and 0 < rows["fp8"]["rel_rms"]
    b = {n: r["linear_bytes"] for n, r in rows.items()}
    assert b["q4"] < b["q5"] < b["fp8"] < b["bf16"] < b["fp32 (scale)"] and b["nvfp4"] < b["fp8"]
