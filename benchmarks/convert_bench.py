"""Converter throughput and memory on a synthetic multi-GB sharded bf16 checkpoint (a benchmark, not a test).

    /work/venv/bin/python benchmarks/convert_bench.py [--dir /tmp/ninfer-convert-bench] [--layers 14] [--keep]

Writes a Qwen3.5-shaped checkpoint of random bytes (vocab 248320, hidden 2048, untied, MTP; ~3.8 GB with 14
layers) shard by shard, then in fresh child processes (so each peak RSS is its own): a raw read/write copy of the
same shard bytes (64 MiB chunks, fsync), and ``convert_checkpoint``. Reports MB/s of both and the converter's peak
RSS against the largest tensor. The source is in the page cache for both runs (it was just written), so this
measures the converter's own overhead, not the disk. Everything is deleted afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SHARD_BYTES = 1 << 30
POOL_BYTES = 64 << 20


def bench_config(layers: int) -> dict:
    return dict(model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"], vocab_size=248320, hidden_size=2048,
                num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                linear_value_head_dim=128, intermediate_size=6144, mtp_num_hidden_layers=1,
                tie_word_embeddings=False)


def _tensors(raw_cfg: dict) -> list[tuple[str, tuple[int, ...], str]]:
    from ninfer.models.qwen3_5.config import Qwen35Config
    from ninfer.models.qwen3_5.params import logical_parameters

    cfg = Qwen35Config.from_hf(raw_cfg)
    out = []
    for name, spec in logical_parameters(cfg).items():
        key = name if name.startswith(("mtp.", "lm_head")) else f"model.{name}"
        out.append((key, spec.shape, "F32" if spec.kind == "fp32" else "BF16"))
    return out


def _write_shard(path: Path, entries: list[tuple[str, tuple[int, ...], str]], pool: memoryview) -> int:
    header, pos = {}, 0
    for key, shape, dt in entries:
        n = int(np.prod(shape)) * (4 if dt == "F32" else 2)
        header[key] = {"dtype": dt, "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        left, i = pos, 0
        while left:
            n = min(left, len(pool) - i)
            f.write(pool[i: i + n])
            left, i = left - n, (i + n) % len(pool)
    return pos


def synthesize(src: Path, layers: int) -> tuple[int, int]:
    """Write the checkpoint; returns (tensor bytes, largest tensor bytes)."""
    src.mkdir(parents=True, exist_ok=True)
    raw_cfg = bench_config(layers)
    (src / "config.json").write_text(json.dumps(raw_cfg))
    # Random bf16 bit patterns (NaNs included): the converter must move bytes, not interpret them.
    pool = memoryview(np.random.default_rng(0).integers(0, 256, POOL_BYTES, dtype=np.uint8).tobytes())
    shards, cur, size = [], [], 0
    for key, shape, dt in _tensors(raw_cfg):
        n = int(np.prod(shape)) * (4 if dt == "F32" else 2)
        if cur and size + n > SHARD_BYTES:
            shards.append(cur)
            cur, size = [], 0
        cur.append((key, shape, dt))
        size += n
    shards.append(cur)
    weight_map, total, largest = {}, 0, 0
    for s, entries in enumerate(shards, start=1):
        name = f"model-{s:05d}-of-{len(shards):05d}.safetensors"
        total += _write_shard(src / name, entries, pool)
        for key, shape, dt in entries:
            weight_map[key] = name
            largest = max(largest, int(np.prod(shape)) * (4 if dt == "F32" else 2))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    return total, largest


def child_copy(src: Path, dst: Path) -> dict:
    dst.mkdir(parents=True, exist_ok=True)
    buf = bytearray(POOL_BYTES)
    t0 = time.perf_counter()
    n = 0
    for f in sorted(src.glob("*.safetensors")):
        with open(f, "rb") as fi, open(dst / f.name, "wb") as fo:
            while (k := fi.readinto(buf)) > 0:
                fo.write(memoryview(buf)[:k])
                n += k
            fo.flush()
            os.fsync(fo.fileno())
    return {"seconds": time.perf_counter() - t0, "bytes": n}


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child_convert(src: Path, out: Path, dtype: str | None = None) -> dict:
    from ninfer.convert.convert import convert_checkpoint

    base = _maxrss()  # interpreter + torch, before any tensor is read
    t0 = time.perf_counter()
    convert_checkpoint(src, out, progress=False, dtype=dtype)
    t1 = time.perf_counter()
    # Peak RSS of the conversion itself; verification maps the whole output and would count its pages too.
    stats = {"seconds": t1 - t0, "maxrss_bytes": _maxrss(), "base_rss_bytes": base, "out_bytes": out.stat().st_size}
    from ninfer.artifact import open_artifact

    with open_artifact(out, ("text", "mtp")) as a:
        stats["verified_bytes"] = a.verify()
    stats["verify_seconds"] = time.perf_counter() - t1
    return stats


def _run_child(*args: str) -> dict:
    res = subprocess.run([sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/ninfer-convert-bench")
    ap.add_argument("--layers", type=int, default=14)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "SRC", "DST"))
    args = ap.parse_args()
    if args.child:
        mode, src, dst = args.child
        if mode == "copy":
            stats = dict(child_copy(Path(src), Path(dst)), maxrss_bytes=_maxrss())
        else:
            stats = child_convert(Path(src), Path(dst), None if mode == "convert" else mode.split(":")[1])
        print(json.dumps(stats))
        return
    root = Path(args.dir)
    try:
        t0 = time.perf_counter()
        total, largest = synthesize(root / "src", args.layers)
        os.sync()  # flush the synthesized shards so their writeback does not slow the timed runs
        print(f"synthesized {total / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s; largest tensor {largest / 1e9:.2f} GB")
        copy = _run_child("copy", str(root / "src"), str(root / "copy"))
        shutil.rmtree(root / "copy")
        mb = total / 1e6
        print(f"raw copy        {copy['seconds']:6.2f} s  {mb / copy['seconds']:5.0f} MB/s"
              f"  peak RSS {copy['maxrss_bytes'] / 1e9:.2f} GB")
        for mode in ("convert", "convert:float16"):
            conv = _run_child(mode, str(root / "src"), str(root / "out.ninfer"))
            rss, base = conv["maxrss_bytes"], conv["base_rss_bytes"]
            print(f"{mode:<15} {conv['seconds']:6.2f} s  {mb / conv['seconds']:5.0f} MB/s  peak RSS {rss / 1e9:.2f} GB"
                  f" (import baseline {base / 1e9:.2f} GB; above it {(rss - base) / largest:.2f}x the largest tensor)"
                  f"  verify {conv['verified_bytes'] / 1e6 / conv['verify_seconds']:.0f} MB/s")
            (root / "out.ninfer").unlink()
            os.sync()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
