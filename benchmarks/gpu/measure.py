"""Timing, bandwidth and floor arithmetic for the GPU benchmark (no model code here)."""

from __future__ import annotations

import time
from typing import Callable

import torch

from ninfer.models.qwen3_5.capacity import gdn_state_bytes_per_layer, kv_bytes_per_token_all_layers, weight_bytes
from ninfer.models.qwen3_5.config import Qwen35Config


def cuda_ms(fn: Callable[[], object], iters: int, warmup: int = 2) -> float:
    """Milliseconds per call on the device timeline. Calls are issued back to back, so when the host cannot keep up
    (eager launches) the gaps are counted: this is throughput, not kernel time."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        # the --smoke run on a CPU: host wall time
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t) * 1e3 / iters
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def graph_us(fn: Callable[[], object], calls: int) -> float:
    """Microseconds per call inside one CUDA graph of ``calls`` back-to-back calls (no launch gaps); on a CPU
    (--smoke) one host-timed call."""
    if not torch.cuda.is_available():
        # --smoke: one host-timed call (the interpreter), only to exercise the path
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * calls)


def hbm_bandwidth(gib: int = 4, iters: int = 10) -> dict:
    """Device copy of ``gib`` GiB (read + write counted) and a read-only reduction, in TB/s."""
    result = _bandwidth(gib, iters)
    torch.cuda.empty_cache()  # the buffers died with _bandwidth's frame
    return result


def _bandwidth(gib: int, iters: int) -> dict:
    n = gib * (1 << 30) // 4
    src = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    out = torch.empty((), dtype=torch.float32, device="cuda")
    copy_ms = cuda_ms(lambda: dst.copy_(src), iters)
    read_ms = cuda_ms(lambda: torch.sum(src, dim=0, out=out), iters)
    return {"copy_tb_s": 2 * n * 4 / copy_ms / 1e9, "read_tb_s": n * 4 / read_ms / 1e9, "bytes": n * 4}


def weight_bytes_read(cfg: Qwen35Config, batch: int) -> int:
    """bf16 weight bytes one decode step must stream: every weight once, except that an untied embedding is read
    only at B rows (negligible) and an MoE layer reads at most min(E, B*k) of its experts."""
    total = weight_bytes(cfg, "bfloat16")
    if not cfg.tie_word_embeddings:
        total -= cfg.vocab_size * cfg.hidden_size * 2
    if cfg.is_moe:
        per_expert = 3 * cfg.moe_intermediate_size * cfg.hidden_size * 2
        unused = cfg.num_experts - min(cfg.num_experts, batch * cfg.num_experts_per_tok)
        total -= cfg.num_hidden_layers * unused * per_expert
    return total


def decode_floor(cfg: Qwen35Config, batch: int, context: int, bandwidth_tb_s: float) -> dict:
    """Bytes one decode step must move (weights + every sequence's KV read + GDN state read and written) and the
    time that takes at the measured bandwidth."""
    w = weight_bytes_read(cfg, batch)
    kv = batch * (context + 1) * kv_bytes_per_token_all_layers(cfg, "bfloat16")
    state = batch * len(cfg.linear_layers) * 2 * gdn_state_bytes_per_layer(cfg, "bfloat16").total
    total = w + kv + state
    return {"weight_bytes": w, "kv_bytes": kv, "state_bytes": state, "bytes": total,
            "floor_ms": total / (bandwidth_tb_s * 1e9) if bandwidth_tb_s > 0 else float("nan")}
