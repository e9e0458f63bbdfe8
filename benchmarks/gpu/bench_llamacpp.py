"""llama.cpp's CUDA build as a peer on the same GPU run, at the shapes of shapes.py with random bf16 weights.

The source is the llama.cpp that the llama-cpp-python 0.3.36 sdist bundles (commit 0c1e57098, which runs Qwen3.5),
trimmed of models, docs and other backends and carried as `.carry/llama.cpp-0c1e570.tar.xz` (`--make-source`
makes it from the sdist here; nothing is fetched on the device). On the device: build `llama-bench` and
`llama-batched-bench` for sm_90, write each shape as a transformers checkpoint (bench_hf's random init, the real
Qwen3.5 `tokenizer.json` carried as `.carry/qwen35_tokenizer.json.gz`), convert it with llama.cpp's own
`convert_hf_to_gguf.py --no-mtp` to bf16 GGUF (its Qwen3.5 class otherwise asserts MTP layers), then measure:
  - decode: `llama-batched-bench -npp 512 -ntg N -npl 1,2,4,8` (B parallel sequences after a 512-token prompt, as
    bench_engine's 512-token context); step_ms = t_tg / N, one decode step of B tokens;
  - tg128 at B=1 from an empty context (`llama-bench -n 128 -p 0`), the number llama.cpp users quote;
  - prefill: `llama-bench -p 2048,8192 -n 0` tokens per second.
Flash attention on, all layers on the GPU. Writes bench_llamacpp.json to --out and prints a table.

Run: python benchmarks/gpu/bench_llamacpp.py [--models 0.8B,9B] [--deadline-s 500] [--out DIR]
     python benchmarks/gpu/bench_llamacpp.py --make-source SDIST.tar.gz   # here: the trimmed source for .carry
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / ".carry" / "llama.cpp-0c1e570.tar.xz"
TOKENIZER = ROOT / ".carry" / "qwen35_tokenizer.json.gz"
WORK = Path(os.environ.get("LLAMACPP_WORK", "/tmp/llamacpp"))
# trimmed from the sdist's vendor/llama.cpp: nothing the CUDA build of the two bench tools reads
DROP = ("models", "docs", "media", "tools/ui", "pocs", "benches", "ci", "skills") + tuple(
    f"ggml/src/ggml-{b}" for b in ("openvino", "webgpu", "et", "metal", "hexagon", "sycl", "vulkan", "opencl",
                                   "cann", "musa", "hip", "zdnn", "rpc", "blas", "kompute", "virtgpu"))
BATCHES = (1, 2, 4, 8)
PREFILL = (2048, 8192)


def make_source(sdist: Path) -> None:
    """The carried source: the sdist's vendor/llama.cpp without DROP, as a tar.xz (about 5 MB)."""
    tmp = WORK / "make"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp, filter="data")
    src = next(tmp.glob("*/vendor/llama.cpp"))
    for rel in DROP:
        shutil.rmtree(src / rel, ignore_errors=True)
    SOURCE.parent.mkdir(exist_ok=True)
    with tarfile.open(SOURCE, "w:xz") as tar:
        tar.add(src, arcname="llama.cpp")
    from ninfer.convert.tokenizer import build_qwen35_tokenizer_json

    TOKENIZER.write_bytes(gzip.compress(build_qwen35_tokenizer_json().encode()))
    print(f"wrote {SOURCE} ({SOURCE.stat().st_size >> 20} MiB) and {TOKENIZER}")


def sh(cmd: list[str], timeout: float, **kw) -> str:
    print("+", " ".join(map(str, cmd)), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[0]} rc={done.returncode}: {(done.stderr or done.stdout)[-1500:]}")
    return done.stdout


def build(timeout: float) -> Path:
    src, out = WORK / "llama.cpp", WORK / "build"
    if not (out / "bin" / "llama-batched-bench").exists():
        shutil.rmtree(src, ignore_errors=True)
        with tarfile.open(SOURCE) as tar:
            tar.extractall(WORK, filter="data")
        off = [f"-D{k}=OFF" for k in ("LLAMA_CURL", "LLAMA_OPENSSL", "LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES",
                                      "LLAMA_BUILD_SERVER", "LLAMA_BUILD_APP", "LLAMA_BUILD_HTML", "GGML_NATIVE")]
        sh(["cmake", "-S", str(src), "-B", str(out), "-G", "Ninja", "-DGGML_CUDA=ON",
            "-DCMAKE_CUDA_ARCHITECTURES=90", "-DCMAKE_BUILD_TYPE=Release", *off], timeout)
        sh(["cmake", "--build", str(out), "--target", "llama-bench", "llama-batched-bench", "-j",
            str(os.cpu_count() or 8)], timeout)
    return out / "bin"


def gguf(name: str, timeout: float) -> Path:
    """The shape as a random bf16 transformers checkpoint, converted by llama.cpp's own script."""
    import torch
    from bench_hf import Settings, build as build_hf

    path, hf = WORK / f"{name}.gguf", WORK / f"hf-{name}"
    if path.exists():
        return path
    model = build_hf(name, Settings())
    model.save_pretrained(hf)
    del model
    torch.cuda.empty_cache()
    (hf / "tokenizer.json").write_bytes(gzip.decompress(TOKENIZER.read_bytes()))
    (hf / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
    env = {**os.environ, "PYTHONPATH": f"{WORK / 'llama.cpp' / 'gguf-py'}:{os.environ.get('PYTHONPATH', '')}"}
    sh([sys.executable, str(WORK / "llama.cpp" / "convert_hf_to_gguf.py"), str(hf), "--no-mtp", "--outtype", "bf16",
        "--outfile", str(path)], timeout, env=env)
    shutil.rmtree(hf)
    return path


def decode(bins: Path, model: Path, new_tokens: int, timeout: float) -> dict:
    out = sh([str(bins / "llama-batched-bench"), "-m", str(model), "-ngl", "99", "-fa", "on", "-c", "8192",
              "-npp", "512", "-ntg", str(new_tokens), "-npl", ",".join(map(str, BATCHES)),
              "--output-format", "jsonl"], timeout)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {f"B{r['pl']}": {"step_ms": 1000.0 * r["t_tg"] / r["tg"], "tok_s": r["speed_tg"]} for r in rows}


def llama_bench(bins: Path, model: Path, args: list[str], timeout: float) -> list[dict]:
    out = sh([str(bins / "llama-bench"), "-m", str(model), "-ngl", "99", "-fa", "1", "-r", "3", "-o", "json",
              *args], timeout)
    return json.loads(out)


def bench_model(bins: Path, name: str, results: dict, left) -> None:
    t = time.monotonic()
    model = gguf(name, left())
    entry = results["models"].setdefault(name, {"gguf_s": round(time.monotonic() - t, 1)})
    entry["decode_512ctx"] = decode(bins, model, 64, left())
    tg = llama_bench(bins, model, ["-p", "0", "-n", "128"], left())
    entry["tg128_ms"] = 1000.0 / tg[0]["avg_ts"]
    pp = llama_bench(bins, model, ["-p", ",".join(map(str, PREFILL)), "-n", "0"], left())
    entry["prefill_tok_s"] = {str(r["n_prompt"]): r["avg_ts"] for r in pp}
    model.unlink()  # a 9B GGUF is 18 GB of a 64 GB disk


def print_table(results: dict) -> None:
    print("=" * 100)
    print(f"llama.cpp {results['commit']} CUDA sm_90 bf16, flash attention, ms per decode step at 512 context")
    print(f"{'model':<10}" + "".join(f"{'B=' + str(b):>9}" for b in BATCHES) + f"{'tg128':>9}"
          + "".join(f"{'pp' + str(p) + ' tok/s':>16}" for p in PREFILL))
    for name, e in results["models"].items():
        dec = e.get("decode_512ctx", {})
        cells = "".join(f"{dec.get(f'B{b}', {}).get('step_ms', float('nan')):>9.2f}" for b in BATCHES)
        pre = "".join(f"{e.get('prefill_tok_s', {}).get(str(p), float('nan')):>16.0f}" for p in PREFILL)
        print(f"{name:<10}{cells}{e.get('tg128_ms', float('nan')):>9.2f}{pre}")
    for part, err in results["errors"].items():
        print(f"ERROR {part}: {err[:400]}")
    print("=" * 100)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="0.8B,9B")
    ap.add_argument("--deadline-s", type=float, default=500.0)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--make-source", type=Path, metavar="SDIST", help="write the carried source from the sdist")
    args = ap.parse_args()
    if args.make_source:
        make_source(args.make_source)
        return 0
    deadline = time.monotonic() + args.deadline_s
    left = lambda: max(deadline - time.monotonic(), 1.0)  # noqa: E731
    results = {"commit": "0c1e57098", "models": {}, "errors": {}}
    WORK.mkdir(parents=True, exist_ok=True)
    try:
        t = time.monotonic()
        bins = build(left())
        results["build_s"] = round(time.monotonic() - t, 1)
        for name in args.models.split(","):
            try:
                bench_model(bins, name, results, left)
            except Exception as exc:  # noqa: BLE001 - one model failing must not lose the others
                results["errors"][name] = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001
        results["errors"]["build"] = f"{type(exc).__name__}: {exc}"
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_llamacpp.json").write_text(json.dumps(results, indent=1))
    print_table(results)
    return 0 if not results["errors"] else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
