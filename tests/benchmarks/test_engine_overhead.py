"""benchmarks/engine_overhead.py runs small: its no-op Program still satisfies the Engine (the script failed the
Engine unnoticed once the chunk sizing asked for the prompt's remaining tokens), and every timed round decodes every
row (the script raises otherwise). Only that it measures is checked, never a speed."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_engine_overhead_measures_every_batch_size():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_overhead.py"), "--rounds", "300"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == ["1", "2", "4", "8"]
    assert all(math.isfinite(float(r[1])) and float(r[1]) > 0 for r in rows)
