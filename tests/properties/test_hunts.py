"""`fixed_constants`: a derandomized hunt draws the same examples whatever the process imported before it.

Each case runs in its own process (an import cannot be undone): a derandomized test draws 300 integers, after
importing one more local module (with literal integers of its own, as any module outside the hunted code has) or
not.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DRAWS = """
import contextlib, importlib, sys
from hypothesis import Phase, given, settings, strategies as st
from ninfer.testing.hunts import fixed_constants
extra, fixed = sys.argv[1], sys.argv[2] == "1"
if extra != "-":
    sys.path.insert(0, extra)
    importlib.import_module("hunt_extra")
seen = []

@settings(max_examples=300, derandomize=True, database=None, phases=[Phase.generate])
@given(st.integers(0, 1 << 20))
def draw(n):
    seen.append(n)

with fixed_constants() if fixed else contextlib.nullcontext():
    draw()
print(seen)
"""
ROOT = Path(__file__).resolve().parents[2]


def _draws(extra: Path | None, fixed: bool) -> str:
    done = subprocess.run([sys.executable, "-c", DRAWS, str(extra or "-"), "1" if fixed else "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _extra(tmp_path: Path) -> Path:
    folder = tmp_path / "extra"  # a local module (not a test file, which Hypothesis skips)
    folder.mkdir()
    (folder / "hunt_extra.py").write_text("LIMITS = (123457, 654321, 424242, 99991, 31337, 777777, 1000003)\n")
    return folder


def test_a_hunt_draws_the_same_examples_whatever_was_imported_before(tmp_path):
    assert _draws(None, True) == _draws(_extra(tmp_path), True)


def test_without_it_an_earlier_import_changes_the_examples(tmp_path):
    # the premise (Hypothesis' pool of local constants): were these equal, the wrapper would guard nothing
    assert _draws(None, False) != _draws(_extra(tmp_path), False)
