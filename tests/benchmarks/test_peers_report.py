"""peers_report.py on the ninth session's H100 results (benchmarks/results/2026-12-06-s9-h100-*-7887958.json): the
rows pair the Engine's 512-context decode and one-piece prefill with llama.cpp's and HF's same cases, the ratio reads
"ninfer is x times faster" both ways (time for decode, rate for prefill), and a peer that did not run leaves its
cells empty instead of pairing with another case. report.py finds the files in run.sh's part folders."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
import peers_report as pr  # noqa: E402
import report  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def _load(part: str) -> dict:
    return json.loads((RESULTS / f"2026-12-06-s9-h100-{part}-7887958.json").read_text())


def _row(rows, model: str, case: str) -> pr.PeerRow:
    return next(r for r in rows if r.model == model and r.case == case)


def test_rows_pair_the_same_cases():
    rows = pr.peer_rows(_load("engine"), _load("llamacpp"), _load("hf"))
    assert [r.case for r in rows if r.model == "9B"] == [
        "decode B=1", "decode B=2", "decode B=4", "decode B=8", "prefill 2048 tok/s", "prefill 8192 tok/s"]
    b8 = _row(rows, "9B", "decode B=8")
    assert (round(b8.ninfer, 2), round(b8.llamacpp, 2), round(b8.hf, 2)) == (7.63, 11.22, 75.72)
    assert b8.faster == pytest.approx(11.22 / 7.63, rel=1e-3)  # llama.cpp's time over ours
    pre = _row(rows, "9B", "prefill 2048 tok/s")
    assert pre.faster == pytest.approx(36540 / 17204, rel=1e-3)  # our rate over llama.cpp's
    assert _row(rows, "0.8B", "decode B=2").hf is None  # HF measured B = 1 and 8 only


def test_a_missing_peer_leaves_its_cells_empty():
    rows = pr.peer_rows(_load("engine"), None, _load("hf"))
    assert all(r.llamacpp is None and r.faster is None for r in rows)
    assert _row(rows, "9B", "decode B=1").hf == pytest.approx(82.62, abs=0.01)


def test_report_finds_the_part_folders(tmp_path, capsys):
    for part, name in (("engine", "bench_engine.json"), ("llamacpp", "bench_llamacpp.json"), ("hf", "bench_hf.json")):
        (tmp_path / part).mkdir()
        shutil.copy(RESULTS / f"2026-12-06-s9-h100-{part}-7887958.json", tmp_path / part / name)
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "9B       decode B=8                 7.63      11.22      75.72         1.47x" in out


def test_peers_only(tmp_path, capsys):
    (tmp_path / "engine").mkdir()
    shutil.copy(RESULTS / "2026-12-06-s9-h100-engine-7887958.json", tmp_path / "engine" / "bench_engine.json")
    shutil.copy(RESULTS / "2026-12-06-s9-h100-fast-7887958.json", tmp_path / "bench_fast.json")
    shutil.copy(RESULTS / "2026-12-06-s9-h100-llamacpp-7887958.json", tmp_path / "bench_llamacpp.json")
    assert report.main(["--peers", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # the peers table alone: no executor table
    assert "ninfer Engine vs llama.cpp 0c1e57098" in out and "decode (random bf16 weights" not in out
