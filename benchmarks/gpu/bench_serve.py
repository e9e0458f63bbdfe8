"""Issue 14's "measure as a user would": `ninfer bench serve` (the CLI, its own process) against a server process
over the fast Program (the real Gateway, Frontend, uvicorn and Engine of `ninfer serve`: `ninfer.serve.server.serve`
with the Runtime's Engine settings, async scheduling on), per shape: TTFT, TPOT, ITL and end-to-end percentiles at
concurrency 1, 4 and 8 on one fixed request mix (prompts of 512 random token ids, 128 output tokens, greedy,
`ignore_eos`), after a warm-up run at the largest concurrency.

The server is this script with `--serve SHAPE --port P`: its weights are random and made on the device, as
bench_engine's are (no 9B artifact on disk), and its tokenizer and chat template are the carried default model's
(run.sh exports NINFER_TEST_DEFAULT_MODEL for .carry/default.ninfer). It needs the carried wheels (fastapi, uvicorn).

Run: python benchmarks/gpu/bench_serve.py [--models 9B,0.8B] [--deadline-s 280] [--out DIR]
     python benchmarks/gpu/bench_serve.py --smoke   # a tiny shape (with the real vocabulary) on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlog import Run, bench_arguments, print_problems  # noqa: E402

from ninfer.testing.live_server import free_port, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Settings:
    device: str = "cuda"
    kernels: str = "triton"
    lanes: int = 8
    max_context: int = 4096
    levels: tuple[int, ...] = (1, 4, 8)
    prompts_per_lane: int = 4  # each level sends levels * this many requests
    input_len: int = 512
    output_len: int = 128
    ready_timeout_s: float = 240.0  # the 9B build, warm-up and graph capture
    budget_fraction: float = 0.9


SMOKE = Settings(device="cpu", kernels="naive", lanes=2, max_context=256, levels=(1, 2), prompts_per_lane=2,
                 input_len=16, output_len=4, ready_timeout_s=240.0)


def serve_shape(shape: str, port: int, s: Settings) -> None:
    """The server process: the fast Program on `shape` with random weights behind `ninfer serve`'s server."""
    from bench_agent import _frontend, _tokenizer_path
    from shapes import config, random_source

    from ninfer.engine.engine import Engine
    from ninfer.fast.memory import device_budget
    from ninfer.fast.program import FastProgram, FastProgramConfig
    from ninfer.runtime import Runtime
    from ninfer.runtime_options import RuntimeOptions
    from ninfer.serve.server import serve
    from ninfer.wiring import _engine_config

    cfg, tokenizer = config(shape), _tokenizer_path(None)
    budget = 1 << 30 if s.device == "cpu" else device_budget(s.budget_fraction)
    program = FastProgram.build(cfg, random_source(cfg, s.device), FastProgramConfig(
        max_concurrency=s.lanes, max_context=s.max_context), budget_bytes=budget, device=s.device, kernels=s.kernels)
    options = RuntimeOptions(max_model_len=s.max_context, max_num_seqs=s.lanes)
    engine = Engine(program, _engine_config(options, async_default=True))
    rt = Runtime(options, f"random-{shape}", tokenizer, True, "fast", _frontend(tokenizer, s.max_context),
                 s.max_context, "random weights", engine=engine)
    serve(rt, host="127.0.0.1", port=port, api_key=None, log_level="warning")


def bench_serve(url: str, s: Settings, concurrency: int, prompts: int, out: Path) -> dict:
    """One `ninfer bench serve` run, as a user types it; its --save-result summary."""
    cmd = [sys.executable, "-m", "ninfer.cli", "bench", "serve", "--base-url", url, "--max-concurrency",
           str(concurrency), "--num-prompts", str(prompts), "--random-input-len", str(s.input_len),
           "--random-output-len", str(s.output_len), "--save-result", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env())
    if done.returncode != 0:
        raise RuntimeError(f"ninfer bench serve failed: {done.stderr[-1500:]}")
    return json.loads(out.read_text())


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT)] + os.environ.get("PYTHONPATH", "").split(
        os.pathsep))}


def bench_model(run: Run, name: str, smoke: bool) -> None:
    s, port = run.s, free_port()
    url, entry = f"http://127.0.0.1:{port}", run.results["models"].setdefault(name, {})
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "server.log", "w")
        server = subprocess.Popen([sys.executable, __file__, "--serve", name, "--port", str(port)]
                                  + (["--smoke"] if smoke else []), stdout=log, stderr=subprocess.STDOUT, env=_env())
        try:
            entry["ready_s"] = wait_ready(url, server, s.ready_timeout_s)
            top = max(s.levels)
            bench_serve(url, s, top, top, Path(tmp) / "warm.json")  # every prefill length and graph warmed
            for c in s.levels:
                if run.left() < 20:
                    run.results["skipped"].append(f"{name} concurrency {c} (deadline)")
                    continue
                entry[str(c)] = bench_serve(url, s, c, c * s.prompts_per_lane, Path(tmp) / f"c{c}.json")
                run.save()
        finally:
            server.terminate()
            server.wait(60)
            log.close()
            entry["server_log_tail"] = (Path(tmp) / "server.log").read_text()[-2000:]


def print_table(r: dict) -> None:
    print("\n" + "=" * 100)
    print(f"ninfer bench serve against ninfer's server (fast Program, random weights) on {r.get('device')}; "
          f"wall {r.get('wall_s', 0):.0f} s")
    print(f"{'model':8} {'conc':>4} {'req':>4} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} {'TPOT p50':>9} {'p99':>8} "
          f"{'ITL p50':>8} {'p99':>8}")
    for name, levels in r.get("models", {}).items():
        for c, m in levels.items():
            if not isinstance(m, dict):
                continue
            print(f"{name:8} {c:>4} {m['completed']:>4} {m['output_throughput']:8.1f} "
                  f"{m.get('median_ttft_ms', float('nan')):9.2f} {m.get('p99_ttft_ms', float('nan')):8.2f} "
                  f"{m.get('median_tpot_ms', float('nan')):9.2f} {m.get('p99_tpot_ms', float('nan')):8.2f} "
                  f"{m.get('median_itl_ms', float('nan')):8.2f} {m.get('p99_itl_ms', float('nan')):8.2f}")
    print_problems(r)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if "--serve" in argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--serve", required=True)
        ap.add_argument("--port", type=int, required=True)
        ap.add_argument("--smoke", action="store_true")
        args = ap.parse_args(argv)
        serve_shape(args.serve, args.port, SMOKE if args.smoke else Settings())
        return 0
    ap = bench_arguments(280.0, "a tiny shape (real vocabulary) on the CPU with the naive kernels")
    args = ap.parse_args(argv)
    if args.models == ap.get_default("models"):
        args.models = "9B,0.8B"
    run = Run(args.deadline_s, args.out, SMOKE if args.smoke else Settings(), "bench_serve.json")
    if not run.need_cuda(args.smoke, print_table):
        return 1
    models = ["tiny-vocab"] if args.smoke else [m for m in args.models.split(",") if m]
    for name in models:
        run.part(name, bench_model, run, name, args.smoke)
    run.results["wall_s"] = time.monotonic() - run.t0
    run.save()
    print_table(run.results)
    return 0 if not run.results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
