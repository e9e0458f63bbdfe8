"""bench_vision.py's CPU smoke run: a tiny tower through the Triton interpreter gives one timed row with its FLOPs
and floor, the FLOP count is the hand count of the tiny tower's GEMMs and attention products, and the Engine part
serves an image request on the fast Program (naive kernels) with a TTFT."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
import bench_vision as bv  # noqa: E402


def test_smoke_row_and_flop_count(tmp_path):
    result = bv.main(["--smoke", "--out", str(tmp_path)])
    (row,) = result["rows"]
    assert (row["patches"], row["tokens"]) == (24, 6) and row["ms"] > 0 and row["x_floor"] > 0
    assert (tmp_path / "bench_vision.json").is_file()
    engine = result["engine"]
    assert engine["prompt_tokens"] == 16 + 4 and engine["ttft_ms"] > 0 and engine["text_only_ttft_ms"] > 0
    v = bv.VisionConfig(**bv.TINY)
    n = 24  # 64 x 96 pixels: 4 x 6 patches
    per_block = 2 * n * 32 * (96 + 32 + 96) + 4 * n * n * 32
    merger = 2 * 6 * 128 * (128 + 64)
    assert bv.flops(v, n) == 2 * n * 1536 * 32 + 2 * per_block + merger
