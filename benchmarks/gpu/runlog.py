"""A benchmark run's deadline, its raw results dict and their JSON file: each part may fail without stopping the
others, and the JSON is rewritten after every part so a run killed at its time limit still leaves its numbers. Also
the pieces every GPU benchmark's main shares: its common flags, the CUDA check, the per-model loop, the footer, and
the release of one model's Program before the next is planned."""

from __future__ import annotations

import argparse
import gc
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

    def need_cuda(self, smoke: bool, print_table) -> bool:
        """False (and the reason recorded and printed) when a real run finds no CUDA device."""
        if smoke or torch.cuda.is_available():
            return True
        self.results["errors"]["setup"] = "no CUDA device"
        self.save()
        print_table(self.results)
        return False

    def each_model(self, names, min_seconds: dict[str, float], fn, *args) -> None:
        """fn(self, name, *args) per model as one part, skipping a model once fewer seconds are left than it needs."""
        for name in names:
            if self.left() < min_seconds.get(name, 60):
                self.results["skipped"].append(f"{name} (deadline: {self.left():.0f}s left)")
                continue
            self.part(name, fn, self, name, *args)
        self.results["wall_s"] = time.monotonic() - self.t0
        self.save()

    def save(self) -> None:
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text(json.dumps(self.results, indent=1, default=str))


def bench_arguments(deadline_s: float, smoke_help: str) -> argparse.ArgumentParser:
    """The flags every GPU benchmark takes: --models, --deadline-s, --out (default $OUT), --smoke."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="0.8B,9B,35B-A3B")
    ap.add_argument("--deadline-s", type=float, default=deadline_s)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--smoke", action="store_true", help=smoke_help)
    return ap


def print_problems(results: dict) -> None:
    """A table's footer: what the deadline skipped and which parts failed."""
    for what in results.get("skipped", []):
        print(f"SKIPPED {what}")
    for part, err in results.get("errors", {}).items():
        print(f"ERROR {part}: {err[:300]}")
    print("=" * 100)


def close(program, engine) -> None:
    """Stop the Engine and drop the Program's CUDA graphs (their pools hold device memory: the decode graphs, the
    prefill pieces' graphs and, under a speculative backend, the round's verify and draft graphs; the reference
    Program has none)."""
    engine.shutdown()
    executor = getattr(program, "executor", None)
    dflash = getattr(executor, "dflash", None)
    for runner in (getattr(program, "runner", None), getattr(program, "pieces", None),
                   getattr(executor, "verifier", None), getattr(executor, "drafter", None),
                   getattr(dflash, "graphs", None)):
        if runner is not None:
            runner.reset()


def free_device(device: str) -> None:
    """Collect what the caller has deleted and hand the freed blocks back, so the next Program's plan measures a
    device without the last one's pools (call it after `del program, engine` in the frame that held them)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
