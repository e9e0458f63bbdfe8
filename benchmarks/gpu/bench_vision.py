"""The fast vision tower alone (issue 15): one 1024x1024 image (64 x 64 = 4096 patches, 1024 merged tokens) through
``FastVisionTower`` at the 9B checkpoint's tower geometry (depth 27, hidden 1152, 16 heads of 72, MLP 4304, out
4096), random bf16 weights. Prints ms per encode (median of timed runs after a warm-up), the matrix FLOPs, the FLOP
floor at the measured bf16 GEMM rate (perf-anchors.md: ~790 TFLOP/s on the H200) and the ratio to it (issue 15's
target: within 2x), and the same for a 512x512 and a 1536x1024 image. The tower is warmed first at the largest
of them (as the Program does at start: the workspace planned, the attention candidates timed and the fastest
kept); the candidates' times at 1024x1024 are printed, then a per-stage breakdown of each image's encode against
each stage's floor (vision_stages.py), which says where a miss of the 2x target comes from.

Then through the Engine (issue 15's TTFT): the fast Program on the 9B text shape (random bf16 weights, one lane,
graphs captured) with that tower, one request of 1024x1024 image (1024 merged tokens) plus 64 text tokens, cold
(each repeat a new image digest, so nothing is reused): time to first token, median of the repeats after a warm-up
request, next to the same prompt's TTFT with the image's tokens as plain text (the encode's share), and how much
device memory the caching allocator reserved beyond what it held at start (the tower is warmed at that image).

Run: python benchmarks/gpu/bench_vision.py [--out DIR]
     python benchmarks/gpu/bench_vision.py --smoke     # a tiny tower on the CPU (Triton interpreter)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shapes import config, random_source  # noqa: E402
from vision_stages import GEMM_TFLOPS, breakdown, print_breakdown  # noqa: E402

from ninfer.contracts.media import PromptImage, PromptMedia, placeholder_ids  # noqa: E402
from ninfer.engine.config import EngineConfig  # noqa: E402
from ninfer.engine.engine import Engine  # noqa: E402
from ninfer.engine.records import GenerationRequest  # noqa: E402
from ninfer.fast.model.vision import FastVisionTower  # noqa: E402
from ninfer.fast.model.vision_attend import measure  # noqa: E402
from ninfer.fast.program import FastProgram, FastProgramConfig  # noqa: E402
from ninfer.fast.program.program import vision_bytes  # noqa: E402
from ninfer.frontend.vision_prompt import mrope_positions  # noqa: E402
from ninfer.testing.sessions import TokenSession  # noqa: E402
from ninfer.models.qwen3_5.params import vision_parameters  # noqa: E402
from ninfer.models.qwen3_5.vision_config import VisionConfig  # noqa: E402

TOWER_9B = dict(depth=27, hidden_size=1152, hidden_act="gelu_pytorch_tanh", intermediate_size=4304, num_heads=16,
                in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=4096,
                num_position_embeddings=2304, rope_theta=10000.0, image_token_id=248056, video_token_id=248057,
                vision_start_token_id=248053, vision_end_token_id=248054)
TINY = dict(TOWER_9B, depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
            num_position_embeddings=36)
IMAGES_9B = ((1024, 1024), (512, 512), (1536, 1024))
IMAGES_TINY = ((64, 96),)


def flops(v: VisionConfig, n: int) -> float:
    """Matrix FLOPs of one encode of n patches (one frame): GEMMs and the two attention products."""
    H, I, m = v.hidden_size, v.intermediate_size, v.merge_unit * v.hidden_size
    block = 2 * n * H * (3 * H + H + 2 * I) + 4 * n * n * H
    return 2 * n * v.patch_dim * H + v.depth * block + 2 * (n // v.merge_unit) * m * (m + v.out_hidden_size)


def random_tower(v: VisionConfig, device: str, dtype: torch.dtype, kernels: str = "triton") -> FastVisionTower:
    gen = torch.Generator().manual_seed(0)
    weights = {s.name: torch.randn(s.shape, generator=gen) * 0.02 + (1.0 if s.name.endswith("norm.weight")
               or s.name.endswith(("norm1.weight", "norm2.weight")) else 0.0) for s in vision_parameters(v)}
    return FastVisionTower(v, weights, dtype, device, kernels)


def image_request(v: VisionConfig, vocab: int, px: int, text: int, seed: int, image: bool = True):
    """A prompt of 3 text tokens, one px x px image (or as many plain text tokens) and `text` - 3 more tokens."""
    rng = np.random.RandomState(seed)
    side = px // v.patch_size
    n = side * side // v.merge_unit
    ids = lambda k: rng.randint(min(1000, vocab // 2), min(2000, vocab), k).tolist()  # noqa: E731
    head, tail = ids(3), ids(text - 3)
    if not image:
        return GenerationRequest(tuple(head + ids(n) + tail), TokenSession(1), 1)
    digest = f"{seed:032x}"
    img = PromptImage(3, (1, side, side), v.spatial_merge_size, digest,
                      rng.standard_normal((side * side, v.patch_dim)).astype(np.float32))
    prompt = head + list(placeholder_ids(digest, n)) + tail
    positions, delta = mrope_positions(len(prompt), [img])
    media = PromptMedia((img,), v.image_token_id, positions, delta)
    return GenerationRequest(tuple(prompt), TokenSession(1), 1, media=media)


def ttft_ms(engine: Engine, request, device: str) -> float:
    t0 = time.perf_counter()
    handle = engine.submit(request)
    engine.run_until_idle()
    if device == "cuda":
        torch.cuda.synchronize()
    result = handle.result(timeout=0)
    if result.error is not None:
        raise RuntimeError(f"request failed: {result.error}")
    return (time.perf_counter() - t0) * 1e3  # one output token: the whole request is its TTFT


def bench_engine(v: VisionConfig, smoke: bool, repeats: int) -> dict:
    """TTFT of one image + 64 text tokens through the Engine on the fast Program (9B text shape)."""
    device, kernels = ("cpu", "naive") if smoke else ("cuda", "triton")
    cfg = config("tiny" if smoke else "9B")
    px, text = (64, 16) if smoke else (1024, 64)
    patches = (px // v.patch_size) ** 2
    settings = FastProgramConfig(max_concurrency=1, max_context=2048, max_prefill_tokens=2048, kv_pages=1024,
                                 dtype=torch.float32 if smoke else torch.bfloat16)
    if smoke:
        budget = 1 << 30
    else:  # measured before the tower loads: vision_bytes counts its weights
        from ninfer.fast.memory import device_budget
        budget = device_budget(0.9)
    # the pad id the model embeds at an image's places is the tower's, inside this (random) model's vocabulary
    v = dataclasses.replace(v, image_token_id=min(v.image_token_id, cfg.vocab_size - 1))
    tower = random_tower(v, device, torch.float32 if smoke else torch.bfloat16, kernels)
    program = FastProgram.build(cfg, random_source(cfg, device), settings, device=device, kernels=kernels,
                                budget_bytes=budget - vision_bytes(tower, patches), vision=tower,
                                vision_patches=patches)
    engine = Engine(program, EngineConfig(max_concurrency=1, prefill_chunk=2048, prefix_caching=False),
                    threaded=False)
    V = cfg.vocab_size
    reserved = torch.cuda.memory_reserved() if device == "cuda" else 0  # after start: the tower warmed at `patches`
    ttft_ms(engine, image_request(v, V, px, text, 0), device)  # warm-up: this grid's tables and kernels
    with_image = [ttft_ms(engine, image_request(v, V, px, text, 1 + i), device) for i in range(repeats)]
    as_text = [ttft_ms(engine, image_request(v, V, px, text, 1 + i, image=False), device) for i in range(repeats)]
    tokens = len(image_request(v, V, px, text, 0).prompt)
    # what serving the images took from the driver after start (the plan says nothing large: docs/vision.md)
    grown = (torch.cuda.memory_reserved() - reserved) / 2**20 if device == "cuda" else 0.0
    return {"image": f"{px}x{px}", "prompt_tokens": tokens, "ttft_ms": statistics.median(with_image),
            "text_only_ttft_ms": statistics.median(as_text), "repeats": repeats, "reserved_growth_mib": grown}


def time_encode(tower: FastVisionTower, grid: tuple[int, int, int], repeats: int, device: str) -> float:
    t, h, w = grid
    pixels = torch.randn(t * h * w, tower.cfg.patch_dim, device=device)
    tower.encode(pixels, grid)  # warm-up: the grid's tables, kernel compilation, allocator blocks
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        tower.encode(pixels, grid)
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def attention_candidates(tower: FastVisionTower, n: int) -> tuple:
    """Every attention candidate's ms at one frame of n patches (random q, k, v), as the tower measures at start."""
    v = tower.cfg
    qkv = torch.randn(n, 3, v.num_heads, v.head_dim, device=tower.device, dtype=tower.dtype)
    cu = torch.tensor([0, n], dtype=torch.int32, device=tower.device)
    out = torch.empty(n, v.num_heads, v.head_dim, device=tower.device, dtype=tower.dtype)
    return measure(tower._candidates, qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, n, out, repeats=10).timings


def _timings(timings) -> str:
    return ", ".join(f"{n} {t:.3f}" if isinstance(t, float) else f"{n} ({t})" for n, t in timings) or "none timed"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    v = VisionConfig(**(TINY if args.smoke else TOWER_9B))
    tower = random_tower(v, device, torch.float32 if args.smoke else torch.bfloat16)
    images = IMAGES_TINY if args.smoke else IMAGES_9B
    tower.warm(max(w_px * h_px for w_px, h_px in images) // v.patch_size ** 2)
    print(f"attention: {tower.attention.name} (measured at start, ms per layer: {_timings(tower.attention.timings)})")
    candidates = ()
    if not args.smoke:
        w_px, h_px = images[0]
        candidates = attention_candidates(tower, w_px * h_px // v.patch_size ** 2)
        print(f"attention candidates at {w_px}x{h_px}, ms per layer: {_timings(candidates)}")
    rows, stages = [], {}
    for w_px, h_px in images:
        grid = (1, h_px // v.patch_size, w_px // v.patch_size)
        n = grid[1] * grid[2]
        ms = time_encode(tower, grid, 1 if args.smoke else 10, device)
        floor = flops(v, n) / (GEMM_TFLOPS * 1e12) * 1e3
        rows.append({"image": f"{w_px}x{h_px}", "patches": n, "tokens": n // 4, "ms": ms,
                     "gflop": flops(v, n) / 1e9, "floor_ms": floor, "x_floor": ms / floor})
        pixels = torch.randn(n, v.patch_dim, device=device)
        stages[f"{w_px}x{h_px}"] = breakdown(tower, pixels, grid, 1 if args.smoke else 5, device)
    print(f"{'image':>10} {'patches':>8} {'tokens':>7} {'ms':>9} {'GFLOP':>8} {'floor ms':>9} {'x floor':>8}")
    for r in rows:
        print(f"{r['image']:>10} {r['patches']:>8} {r['tokens']:>7} {r['ms']:>9.2f} {r['gflop']:>8.1f} "
              f"{r['floor_ms']:>9.3f} {r['x_floor']:>8.2f}")
    for r in rows:
        print_breakdown(r["image"], stages[r["image"]], r["ms"], r["floor_ms"])
    engine = bench_engine(v, args.smoke, 1 if args.smoke else 5)
    print(f"TTFT through the Engine, {engine['image']} image + text, {engine['prompt_tokens']} prompt tokens: "
          f"{engine['ttft_ms']:.1f} ms (the same length as text only: {engine['text_only_ttft_ms']:.1f} ms); device "
          f"memory reserved after start grew by {engine['reserved_growth_mib']:.0f} MiB")
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "rows": rows,
              "target": "1024x1024 within 2x of the floor",
              "pass": None if args.smoke else rows[0]["x_floor"] <= 2.0, "engine": engine,
              "attention": {"chosen": tower.attention.name, "at_start": tower.attention.timings,
                            "at_first_image": candidates}, "stages": stages}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_vision.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
