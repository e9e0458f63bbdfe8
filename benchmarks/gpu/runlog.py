"""A benchmark run's deadline, its raw results dict and their JSON file: each part may fail without stopping the
others, and the JSON is rewritten after every part so a run killed at its time limit still leaves its numbers."""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

import torch


class Run:
    def __init__(self, deadline_s: float, out_dir: str | None, settings, json_name: str):
        self.s = settings
        self.t0 = time.monotonic()
        self.deadline = self.t0 + deadline_s
        self.out = Path(out_dir) / json_name if out_dir else None
        self.results: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
                              "torch": torch.__version__, "errors": {}, "skipped": [], "models": {},
                              "pytest": os.environ.get("NINFER_PYTEST_SUMMARY", "not run")}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def part(self, name: str, fn, *args):
        """Run one part; a failure is recorded and reported, never raised."""
        t = time.monotonic()
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - one failing part must not stop the rest
            self.results["errors"][name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            return None
        finally:
            print(f"[bench] {name}: {time.monotonic() - t:.1f}s ({self.left():.0f}s left)", flush=True)
            self.save()

    def save(self) -> None:
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text(json.dumps(self.results, indent=1, default=str))
