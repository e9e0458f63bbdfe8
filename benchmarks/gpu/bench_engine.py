"""The fast Program behind the public Engine, on real Qwen3.5 shapes with random bf16 weights: what a user of the
Engine sees, host overhead, scheduling and sampling included.

Per model: decode time per step at B = 1, 2, 4, 8 with 512- and 8192-token contexts (B requests decoding together,
timed between the Engine's own output events); time to first token and prefill throughput at 2048 and 8192 tokens;
time to first token for an 8192-token prompt whose first 8000 tokens hit the checkpoint a previous request
retained, and once more with each phase of it timed (`prefill_phases.py`); the inter-token latency of 7 decoding
rows while an 8192-token prompt prefills beside them in chunks sized from the Program's measured PrefillCosts
(issue 14's target: p99 <= 2.5 plain steps, the prompt's prefill throughput >= 95% of one piece alone); how many
32k-token sequences the planned pools hold, and 8 of them decoding at once; peak device memory;
the device's idle time between decode steps at B = 1..8 with async scheduling off and on (`step_gaps.py`, issue
14's target <= 30 us). The Engine runs unthreaded (the caller steps it) so every interval is one or more whole
worker boundaries; async scheduling is on (as `ninfer serve` runs the fast Program) unless NINFER_BENCH_ASYNC=0.
NINFER_BENCH_KERNELS=triton-fused builds the Program on the opt-in op table instead of the default "triton"; with
NINFER_PDL=0 (ninfer.fast.ops.pdl) the decode kernels launch without PDL: the A/Bs of the op tables and of PDL.

Run: python benchmarks/gpu/bench_engine.py [--models 0.8B,9B,35B-A3B] [--deadline-s 240] [--out DIR]
     (env BENCH_ENGINE_PARTS=decode,itl: only those parts)
     python benchmarks/gpu/bench_engine.py --smoke   # the same code paths on a CPU: tiny shape, naive kernels
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_driver import Tracker, drive, steady_step_ms, submit  # noqa: E402
from engine_report import print_table  # noqa: E402
from runlog import Run, bench_arguments, close, free_device  # noqa: E402
from shapes import config, random_prompt, random_source  # noqa: E402
from prefill_phases import PhaseTimer, itl_report  # noqa: E402
from step_gaps import StepGaps  # noqa: E402

from ninfer.engine.config import EngineConfig  # noqa: E402
from ninfer.engine.engine import Engine  # noqa: E402
from ninfer.fast.memory import device_budget  # noqa: E402
from ninfer.fast.ops import pdl  # noqa: E402
from ninfer.fast.program import FastProgram, FastProgramConfig  # noqa: E402
from ninfer.fast.program.config import GRAPHED_PREFILL_TOKENS  # noqa: E402
from ninfer.sampling import SamplingParams  # noqa: E402

LANES = 8


@dataclass(frozen=True)
class Settings:
    device: str = "cuda"
    kernels: str = "triton"
    batches: tuple[int, ...] = (1, 2, 4, 8)
    idle_batches: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    contexts: tuple[int, ...] = (512, 8192)
    sampled_batches: tuple[int, ...] = (1, 8)  # decode at the first context under each of SAMPLINGS
    decode_tokens: int = 48
    prefill: tuple[int, ...] = (2048, 8192)
    hit: tuple[int, int] = (8000, 8192)  # (retained prefix, prompt)
    long_context: int = 32768
    long_tokens: int = 64  # more than the prefill boundaries of the other 7 prompts (4 chunks each)
    prefill_chunk: int = 8192
    itl_prompt: int = 8192  # the long prompt prefilled beside LANES - 1 decoding rows (chunks from PrefillCosts)
    itl_tokens: int = 256  # each decoding row's output: outlasts the long prompt's prefill
    budget_bytes: int | None = None  # None: 90% of the free device memory

    @property
    def max_context(self) -> int:
        return self.long_context


SMOKE = Settings(device="cpu", kernels="naive", batches=(1, 2), sampled_batches=(2,), idle_batches=(1, 2),
                 contexts=(16, 40), decode_tokens=6,
                 prefill=(64, 100), hit=(64, 80), long_context=128, long_tokens=24, prefill_chunk=64, itl_prompt=100,
                 itl_tokens=24, budget_bytes=1 << 30)
# skip a model when less than this many seconds are left (weights, compiles, graphs, the long-context part)
MIN_SECONDS = {"0.8B": 40, "9B": 70, "35B-A3B": 100, "tiny": 1}


def bench_decode(run: Run, engine: Engine, vocab: int, entry: dict) -> None:
    s, gen = run.s, torch.Generator().manual_seed(1)
    rows = entry.setdefault("decode", [])
    drive(engine, [submit(engine, random_prompt(gen, 64, vocab), 4) for _ in range(max(s.batches))])  # warm-up
    for ctx in s.contexts:
        for B in s.batches:
            if run.left() < 10:
                run.results["skipped"].append(f"decode ctx={ctx} B={B} (deadline)")
                continue
            trackers = [submit(engine, random_prompt(gen, ctx, vocab), s.decode_tokens) for _ in range(B)]
            drive(engine, trackers)
            ms, n = steady_step_ms(trackers)
            tpot = statistics.mean((t.token_times[-1] - t.token_times[0]) / (len(t.token_times) - 1)
                                   for t in trackers) * 1e3
            rows.append({"ctx": ctx, "B": B, "step_ms": ms, "intervals": n, "tpot_ms": tpot,
                         "tok_s": B * 1e3 / ms})
            run.save()


# the sampler's graph variants (ninfer/fast/sampling/rows.py) as requests reach them: Qwen3.5's released defaults
# (top-k 20, top-p 0.95: the top_k variant, no sort of the vocabulary), a nucleus alone (the sort variant), neither
SAMPLINGS = {"top_k 20 top_p 0.95": SamplingParams(temperature=0.6, top_k=20, top_p=0.95),
             "top_p 0.95": SamplingParams(temperature=0.6, top_p=0.95),
             "temperature 0.6": SamplingParams(temperature=0.6)}


def bench_sampled(run: Run, engine: Engine, vocab: int, entry: dict) -> None:
    """The decode step of B rows drawn at each of SAMPLINGS (the greedy step is bench_decode's), at the first
    context: what the sampler's variant costs on top of the model step."""
    s, gen = run.s, torch.Generator().manual_seed(3)
    rows, ctx = entry.setdefault("sampled", []), s.contexts[0]
    for name, params in SAMPLINGS.items():
        for B in s.sampled_batches:
            if run.left() < 10:
                run.results["skipped"].append(f"sampled {name} B={B} (deadline)")
                continue
            trackers = [submit(engine, random_prompt(gen, ctx, vocab), s.decode_tokens, params) for _ in range(B)]
            drive(engine, trackers)
            ms, n = steady_step_ms(trackers)
            rows.append({"sampling": name, "ctx": ctx, "B": B, "step_ms": ms, "intervals": n})
            run.save()


def bench_idle(run: Run, engine: Engine, program: FastProgram, vocab: int, entry: dict) -> None:
    """Device idle between consecutive decode steps while B requests (512-token prompts) decode together, with
    async scheduling off, then on (the same Engine; only the flag is swapped between runs, when it is idle)."""
    s, gen, gaps = run.s, torch.Generator().manual_seed(5), StepGaps(program)
    rows = entry.setdefault("idle", [])
    config = engine.core.config
    ctx = s.contexts[0]
    for overlap in (False, True):
        engine.core.config = dataclasses.replace(config, async_scheduling=overlap)
        for B in s.idle_batches:
            if run.left() < 10:
                run.results["skipped"].append(f"idle B={B} async={overlap} (deadline)")
                continue
            trackers = [submit(engine, random_prompt(gen, ctx, vocab), s.decode_tokens) for _ in range(B)]

            def window():  # only the stretch where all B decode: from the last first token to the first end
                if not gaps.recording and all(t.token_times for t in trackers) and not gaps.marks:
                    gaps.start()
                elif gaps.recording and any(t.result is not None for t in trackers):
                    gaps.recording = False

            gaps.marks = []
            drive(engine, trackers, window)
            ms, _ = steady_step_ms(trackers)
            rows.append({"B": B, "async": overlap, "step_ms": ms, **gaps.stop()})
            run.save()
    engine.core.config = config


def bench_prefill(run: Run, engine: Engine, vocab: int, entry: dict) -> None:
    """Time to first token of one request alone (max_tokens 1); a warm-up of the same length first compiles
    whatever that length needs. Every prompt starts with fresh random tokens, so nothing hits a checkpoint."""
    gen = torch.Generator().manual_seed(2)
    rows = entry.setdefault("prefill", [])
    for T in run.s.prefill:
        if run.left() < 10:
            run.results["skipped"].append(f"prefill T={T} (deadline)")
            continue
        drive(engine, [submit(engine, random_prompt(gen, T, vocab), 1)])
        tracker = submit(engine, random_prompt(gen, T, vocab), 1)
        drive(engine, [tracker])
        rows.append({"T": T, "ttft_ms": tracker.ttft * 1e3, "tok_s": T / tracker.ttft, "reused": tracker.reused})


def bench_prefix_hit(run: Run, engine: Engine, program: FastProgram, vocab: int, entry: dict) -> None:
    """The seed's prefix reuse: request A (the first `prefix` tokens) ends and its prompt-end checkpoint is
    retained; request B (the same prefix, then new tokens) resumes from it. Compared with B's prompt cold, and with
    a cold prompt as long as B's suffix (issue 14: a hit at most 1.3x that prompt's TTFT). Then
    one more hit with the PhaseTimer installed: where B's time goes (restore copies, admission, the suffix
    prefill, the first draw), each phase synchronized, so its TTFT is reported apart."""
    gen = torch.Generator().manual_seed(3)
    prefix, total = run.s.hit
    for _ in range(2):  # the first round compiles what a resumed prefill needs; the second is timed
        shared = random_prompt(gen, prefix, vocab)
        drive(engine, [submit(engine, shared, 1)])
        hit = submit(engine, shared + random_prompt(gen, total - prefix, vocab), 1)
        drive(engine, [hit])
    cold = submit(engine, random_prompt(gen, total, vocab), 1)
    drive(engine, [cold])
    short = submit(engine, random_prompt(gen, total - prefix, vocab), 1)  # a cold prompt of the suffix's length
    drive(engine, [short])
    entry["prefix_hit"] = {"prefix": prefix, "prompt": total, "reused": hit.reused, "ttft_ms": hit.ttft * 1e3,
                           "cold_ttft_ms": cold.ttft * 1e3, "cold_reused": cold.reused,
                           "suffix_cold_ttft_ms": short.ttft * 1e3, "hit_vs_suffix_cold": hit.ttft / short.ttft}
    shared = random_prompt(gen, prefix, vocab)
    drive(engine, [submit(engine, shared, 1)])
    timer = PhaseTimer(program).install()
    try:
        hit = submit(engine, shared + random_prompt(gen, total - prefix, vocab), 1)
        drive(engine, [hit])
    finally:
        timer.uninstall()
    entry["prefix_hit"].update(phases=timer.report(), phased_ttft_ms=hit.ttft * 1e3, phased_reused=hit.reused)


def bench_itl(run: Run, engine: Engine, program: FastProgram, vocab: int, entry: dict) -> None:
    """Inter-token latency of LANES - 1 decoding rows while another request prefills `itl_prompt` tokens, with the
    chunks sized from the Program's PrefillCosts (prefill_chunk None: docs/engine.md): the p99 gap against the same
    rows' plain step (target <= prefill_itl_ratio), and the long prompt's prefill throughput against the same
    prompt prefilled alone (target >= 95%). As served, each chunk rides in a decode round's pass (mixed units);
    then, for comparison, the chunks alternating with the rounds."""
    entry["itl"] = _itl(run, engine, program, vocab, mixed=True)
    if run.left() > 40:
        entry["itl_alternating"] = _itl(run, engine, program, vocab, mixed=False)


def _itl(run: Run, engine: Engine, program: FastProgram, vocab: int, mixed: bool) -> dict:
    # another seed for each run: the same prompts would hit the checkpoints the other run left
    s, gen, config, scheduler = run.s, torch.Generator().manual_seed(6 + mixed), engine.core.config, \
        engine.core.scheduler
    engine.core.config = dataclasses.replace(config, prefill_chunk=None)
    was_mixed, scheduler.mixed = scheduler.mixed, mixed and scheduler.mixed
    asked, prefill, decode = [], program.prefill, program.decode
    program.prefill = lambda handle, n, mask=None: asked.append(n) or prefill(handle, n, mask)

    def riding(handles, masks=None, chunk=None):
        if chunk is not None:
            asked.append(chunk.max_tokens)
        return decode(handles, masks, chunk)
    program.decode = riding
    try:
        for _ in range(2):  # the first compiles; the second is the one-piece baseline (nothing decodes: WHOLE)
            alone = submit(engine, random_prompt(gen, s.itl_prompt, vocab), 1)
            drive(engine, [alone])
        decoders = [submit(engine, random_prompt(gen, s.contexts[0], vocab), s.itl_tokens) for _ in range(LANES - 1)]
        long: list[Tracker] = []
        mark = [0]

        def on_step():
            if long:
                long[0].poll(time.perf_counter())
            elif all(len(t.token_times) >= 8 for t in decoders):
                mark[0] = len(asked)
                long.append(submit(engine, random_prompt(gen, s.itl_prompt, vocab), 1))
        drive(engine, decoders, on_step)
        drive(engine, long)
    finally:
        engine.core.config, scheduler.mixed = config, was_mixed
        del program.prefill, program.decode
    chunks = asked[mark[0]:]  # the long prompt's chunks (the decoders prefilled before it was submitted)
    return {"prompt": s.itl_prompt, "decoding": LANES - 1, "chunks": chunks, "mixed": scheduler.mixed and mixed,
            "costs": dataclasses.asdict(program.limits.prefill),
            **itl_report([t.token_times for t in decoders], long[0].submitted, long[0].token_times[0],
                         s.itl_prompt, s.itl_prompt / alone.ttft, config.prefill_itl_ratio)}


def bench_long(run: Run, engine: Engine, program: FastProgram, vocab: int, entry: dict) -> None:
    """How many full-context sequences the planned pools hold, then LANES of them decoding together."""
    s, c = run.s, program.config
    per_seq = c.pages_for(s.long_context)
    usage = program.resource_usage()
    entry["long"] = {"context": s.long_context, "pages_per_sequence": per_seq, "kv_pages": usage.total_pages,
                     "fit_by_pages": usage.total_pages // per_seq, "state_slots": usage.total_slots,
                     "fit_by_slots": (usage.total_slots - c.checkpoint_slots) // 2, "lanes": LANES}
    gen = torch.Generator().manual_seed(4)
    peak = [0]

    def watch():
        peak[0] = max(peak[0], program.resource_usage().active_sequences)

    n = s.long_context - s.long_tokens
    trackers = [submit(engine, random_prompt(gen, n, vocab), s.long_tokens) for _ in range(LANES)]
    t = time.perf_counter()
    drive(engine, trackers, watch)
    ms, gaps = steady_step_ms(trackers)
    entry["long"].update(prompt=n, wall_s=time.perf_counter() - t, peak_active=peak[0], step_ms=ms, intervals=gaps)


def build(s: Settings, name: str) -> tuple[FastProgram, Engine, dict]:
    """(program, engine, build facts) for model `name` (profile_graphs.py profiles this Program's graphs too)."""
    cfg = config(name)
    if s.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t = time.monotonic()
    # the short pieces' graphs asked for: on a CPU smoke run their padded body runs eagerly (off by default there)
    settings = FastProgramConfig(max_concurrency=LANES, max_context=s.max_context, checkpoint_slots=8,
                                 max_prefill_tokens=s.prefill_chunk, prefill_graph_tokens=GRAPHED_PREFILL_TOKENS)
    budget = s.budget_bytes if s.budget_bytes is not None else device_budget(0.9)
    kernels = os.environ.get("NINFER_BENCH_KERNELS", s.kernels) if s.device == "cuda" else s.kernels
    program = FastProgram.build(cfg, random_source(cfg, s.device), settings, budget_bytes=budget, device=s.device,
                                kernels=kernels)
    plan = program.model.plan
    overlap = os.environ.get("NINFER_BENCH_ASYNC", "1") != "0"
    engine = Engine(program, EngineConfig(max_concurrency=LANES, prefill_chunk=s.prefill_chunk,
                                          async_scheduling=overlap), threaded=False)
    info = {"build_s": time.monotonic() - t, "kernels": kernels, "pdl": pdl.ENABLED,
            "weight_bytes": program.model.weights.nbytes, "plan_bytes": plan.total_bytes, "kv_bytes": plan.kv_bytes,
            "state_bytes": plan.state_bytes,
            # what the chunk sizing sees: the eager piece's fixed cost against the prefill graphs' (docs/engine.md)
            "prefill_costs": dataclasses.asdict(program.limits.prefill),
            "prefill_graph_buckets": list(program.pieces.buckets) if program.pieces is not None else []}
    return program, engine, info


def bench_model(run: Run, name: str) -> None:
    entry = run.results["models"].setdefault(name, {})
    program, engine, info = build(run.s, name)
    entry.update(info)
    try:
        _run_parts(run, name, program, engine, entry)
    finally:
        close(program, engine)
        # the pools are most of the device: nothing may keep this Program alive into the next model's plan
        del program, engine
        free_device(run.s.device)


def _run_parts(run: Run, name: str, program: FastProgram, engine: Engine, entry: dict) -> None:
    vocab = program.limits.vocab_size
    parts = {"decode": lambda: bench_decode(run, engine, vocab, entry),
             "sampled": lambda: bench_sampled(run, engine, vocab, entry),
             "idle": lambda: bench_idle(run, engine, program, vocab, entry),
             "prefill": lambda: bench_prefill(run, engine, vocab, entry),
             "prefix hit": lambda: bench_prefix_hit(run, engine, program, vocab, entry),
             "itl": lambda: bench_itl(run, engine, program, vocab, entry),
             "long": lambda: bench_long(run, engine, program, vocab, entry)}
    chosen = os.environ.get("BENCH_ENGINE_PARTS")  # e.g. "decode,itl": those parts alone, in this order
    for part, fn in parts.items():
        if chosen and part not in chosen.split(","):
            continue
        if run.left() < 15:
            run.results["skipped"].append(f"{name} {part} (deadline)")
            continue
        run.part(f"{name} {part}", fn)
        program.check_invariants()
    if run.s.device == "cuda":
        entry["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        entry["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()


def main() -> int:
    args = bench_arguments(240.0, "tiny shape on the CPU with the naive kernels").parse_args()
    run = Run(args.deadline_s, args.out, SMOKE if args.smoke else Settings(), "bench_engine.json")
    report = functools.partial(print_table, lanes=LANES)
    if not run.need_cuda(args.smoke, report):
        return 1
    run.each_model(["tiny"] if args.smoke else args.models.split(","), MIN_SECONDS, bench_model)
    report(run.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
