"""crosshair proves the PEP 316 contracts of the pure rules (page arithmetic, budgets, accepted-prefix rule,
capacity release), time-boxed; and it must find a planted contract violation, so a silent no-op cannot pass."""

import subprocess
import sys
import textwrap


MODULES = ["ninfer.contracts.batch", "ninfer.engine.rules", "ninfer.models.qwen3_5.capacity"]


def _crosshair(*targets: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "crosshair", "check", "--analysis_kind=PEP316", "--per_condition_timeout=4",
           "--max_uninteresting_iterations=60", *targets]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_pure_rules_satisfy_their_contracts():
    proc = _crosshair(*MODULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_crosshair_finds_a_planted_violation(tmp_path):
    bad = tmp_path / "planted_rule.py"
    bad.write_text(textwrap.dedent('''
        def pages(tokens: int, page_size: int) -> int:
            """
            pre: tokens >= 0 and page_size > 0
            post: __return__ * page_size >= tokens
            """
            return tokens // page_size  # floor instead of ceil
    '''))
    proc = _crosshair(str(bad), timeout=120)
    assert proc.returncode != 0 and "planted_rule.py" in proc.stdout, proc.stdout + proc.stderr
