"""Issue 10's agent benchmark on the GPU: `ninfer bench agent`'s scripted tool-calling conversations with thinking
(ninfer.serve.bench_agent) against the in-process server (the real Gateway, Frontend and chat template through
httpx's ASGI transport) over the fast Program on the 9B shape with random bf16 weights.

A warm-up conversation first (every prefill length and decode graph compiles there), then 10 turns whose tool
results of 1,600 words grow the context to about 16k tokens, at 1 and at 4 concurrent conversations; then one more
conversation, 1,000 unrelated chat requests, and its next turn. It prints per-turn prompt, new, cached and
prefilled tokens and TTFT, the Program's measured cost facts and cache counters, and the issue's targets with
pass/fail; the raw numbers go to $OUT/bench_agent.json.

The tokenizer and chat template come from the embedded default model (`--tokenizer`, default
$NINFER_TEST_DEFAULT_MODEL as run.sh exports it for a carried .carry/default.ninfer, else the cached default
model); the server needs fastapi (the carried wheels).

Run: python benchmarks/gpu/bench_agent.py [--deadline-s 230] [--out DIR]
     python benchmarks/gpu/bench_agent.py --smoke   # a tiny shape (with the real vocabulary) on the CPU
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlog import Run, bench_arguments, print_problems  # noqa: E402
from shapes import config, random_source  # noqa: E402

from ninfer.engine.config import EngineConfig  # noqa: E402
from ninfer.engine.engine import Engine  # noqa: E402
from ninfer.fast.memory import device_budget  # noqa: E402
from ninfer.fast.program import FastProgram, FastProgramConfig  # noqa: E402
from ninfer.serve import bench_agent as agent  # noqa: E402
from agent_probe import Probe  # noqa: E402


@dataclass(frozen=True)
class Settings:
    device: str = "cuda"
    kernels: str = "triton"
    shape: str = "9B"
    lanes: int = 4
    max_context: int = 20480  # the 10th turn's prompt is about 16.5k tokens
    turns: int = 10
    levels: tuple[int, ...] = (1, 4)
    tool_result_len: int = 1600
    max_tokens: int = 16
    unrelated: int = 1000
    warm_turns: int = 3
    warm_tool_result_len: int = 1600  # the timed turns' prefill lengths compile here
    kv_offloading_gib: float = 4.0
    budget_bytes: int | None = None  # None: 90% of the free device memory


SMOKE = Settings(device="cpu", kernels="naive", shape="tiny-vocab", lanes=2, max_context=1024, turns=3, levels=(1, 2),
                 tool_result_len=8, max_tokens=2, unrelated=12, warm_turns=1, warm_tool_result_len=4,
                 kv_offloading_gib=0.25, budget_bytes=1 << 30)


def _frontend(path: Path, max_context: int):
    """The Frontend over an artifact's own tokenizer and chat template (the server's, ninfer.wiring)."""
    from ninfer.artifact import open_artifact
    from ninfer.frontend import Frontend
    from ninfer.frontend.tokenizer import Qwen35Tokenizer

    with open_artifact(path) as art:
        tokenizer = Qwen35Tokenizer.load(art.resource("tokenizer.json").decode("utf-8"))
        template = art.resource("chat_template.jinja").decode("utf-8") if "chat_template.jinja" in art.resources \
            else None
    return Frontend(tokenizer, max_context=max_context, chat_template=template)


def _tokenizer_path(given: str | None) -> Path:
    if given or os.environ.get("NINFER_TEST_DEFAULT_MODEL"):
        return Path(given or os.environ["NINFER_TEST_DEFAULT_MODEL"])
    from ninfer.convert.default_model import default_model_path

    return default_model_path()


def build(run: Run, tokenizer: Path):
    """The fast Program on the shape (its vocabulary the real one), the Engine and the in-process app."""
    from ninfer.serve.app import create_app
    from ninfer.serve.state import ServerState
    from ninfer.runtime_options import RuntimeOptions
    from ninfer.runtime import Runtime

    s = run.s
    cfg = config(s.shape)
    t = time.monotonic()
    settings = FastProgramConfig(max_concurrency=s.lanes, max_context=s.max_context,
                                 host_bytes=int(s.kv_offloading_gib * (1 << 30)))
    budget = s.budget_bytes if s.budget_bytes is not None else device_budget(0.9)
    program = FastProgram.build(cfg, random_source(cfg, s.device), settings, budget_bytes=budget, device=s.device,
                                kernels=s.kernels)
    engine = Engine(program, EngineConfig(max_concurrency=s.lanes, async_scheduling=True))  # as `ninfer serve` runs it
    frontend = _frontend(tokenizer, s.max_context)
    options = RuntimeOptions(max_model_len=s.max_context, max_num_seqs=s.lanes)
    rt = Runtime(options, f"random-{s.shape}", tokenizer, True, "fast", frontend, s.max_context, "random weights",
                 engine=engine)
    costs = program.limits.costs
    run.results["build"] = {"shape": s.shape, "build_s": time.monotonic() - t, "kv_pages": program.alloc.total,
                            "state_slots": program.slots.total, "host_budget_bytes": program.host.budget,
                            "costs": dataclasses.asdict(costs)}
    return program, rt, create_app(ServerState(rt, rt.name))


def bench(run: Run, program: FastProgram, rt, app) -> None:
    import httpx

    s = run.s
    transport = httpx.ASGITransport(app=app)
    cfg = agent.AgentConfig("http://bench", turns=s.turns, tool_result_len=s.tool_result_len, max_tokens=s.max_tokens)
    warm = dataclasses.replace(cfg, turns=s.warm_turns, tool_result_len=s.warm_tool_result_len, seed=99)
    asyncio.run(agent.run_agent_bench(warm, transport))
    summaries = {}
    for level in s.levels:
        with Probe() as probe:
            turns = asyncio.run(agent.run_agent_bench(dataclasses.replace(cfg, concurrency=level), transport))
        summaries[level] = agent.summarize_turns(turns)
        run.results["runs"][str(level)] = summaries[level]
        run.results.setdefault("probe", {})[str(level)] = probe.report()
        run.save()
        print(agent.format_turns(summaries[level], level), flush=True)
    reuse = asyncio.run(agent.reuse_after_unrelated(cfg, s.unrelated, transport)) if run.left() > 20 else None
    if reuse is None:
        run.results["skipped"].append(f"reuse after {s.unrelated} unrelated requests (deadline)")
    run.results["reuse"] = reuse
    run.results["targets"] = agent.agent_targets(summaries, reuse)
    stats = rt.engine.cache_report().stats
    run.results["cache"] = {**dataclasses.asdict(stats), "usage": dataclasses.asdict(program.resource_usage())}
    program.check_invariants()


def print_table(r: dict) -> None:
    print("\n" + "=" * 100)
    b = r.get("build", {})
    print(f"ninfer agent benchmark: fast Program on {r.get('device')}, {b.get('shape')} shape, random bf16 weights; "
          f"wall {r.get('wall_s', 0):.0f} s, build {b.get('build_s', 0):.1f} s")
    c = b.get("costs")
    if c:
        print(f"cost facts ({'measured' if c['measured'] else 'generic fallback'}): copy "
              f"{c['copy_bytes_per_s'] / 1e9:.1f} GB/s + {c['copy_latency_s'] * 1e6:.0f} us, prefill "
              f"{c['prefill_tokens_per_s']:.0f} tok/s")
    for level, s in r.get("runs", {}).items():
        print(agent.format_turns(s, int(level)))
        if level in r.get("probe", {}):
            print(Probe.format(r["probe"][level]))
    reuse = r.get("reuse")
    if reuse:
        print(f"after {reuse['unrelated']} unrelated requests: {reuse.get('cached_tokens')} of "
              f"{reuse.get('previous_prompt_tokens')} previous prompt tokens reused ({reuse['reuse']:.1%})"
              f"{'; ' + reuse['error'] if 'error' in reuse else ''}")
    cache = r.get("cache")
    if cache:
        print(f"cache: hits {cache['hits']}/{cache['lookups']}, captures {cache['captures']}, retained "
              f"{cache['retained']}, demotions {cache['demotions']}, host resumes {cache['host_resumes']}, "
              f"promotions {cache['promotions']}, deletions {cache['deletions']}")
    if r.get("targets"):
        print(agent.format_targets(r["targets"]))
    print_problems(r)


def main() -> int:
    ap = bench_arguments(230.0, "a tiny shape on the CPU with the naive kernels")
    ap.add_argument("--tokenizer", default=None, help="a .ninfer artifact whose tokenizer and chat template to use")
    args = ap.parse_args()
    run = Run(args.deadline_s, args.out, SMOKE if args.smoke else Settings(), "bench_agent.json")
    run.results["runs"] = {}
    if not run.need_cuda(args.smoke, print_table):
        return 1
    built = run.part("build", build, run, _tokenizer_path(args.tokenizer))
    if built is not None:
        program, rt, app = built
        try:
            run.part("agent", bench, run, program, rt, app)
        finally:
            rt.close()
    run.results["wall_s"] = time.monotonic() - run.t0
    run.save()
    print_table(run.results)
    return 0 if not run.results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
