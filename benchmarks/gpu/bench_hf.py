"""HF transformers baseline on the same GPU run: transformers' Qwen3.5 text models (with the flash-linear-attention
kernels when `fla` imports; transformers picks them up by itself) at the shapes of shapes.py, random bf16 weights
made on the device. Measures what perf-anchors.md section 9 measured: `generate` (greedy, min_new_tokens =
max_new_tokens) after a 512-token prompt at B = 1 and 8, and prefill as one forward with logits_to_keep=1 at 2048
and 8192 tokens; a wall-clock deadline skips what no longer fits. Writes bench_hf.json to --out and prints a table,
and the side-by-side table with ninfer when bench_fast.json is in the same folder.

Decode: t(N) is one `generate` of N new tokens, t(1) one of a single token (the prefill and the first token);
step_ms = (t(N) - t(1)) / (N - 1) is one decode step of B tokens, which is what section 9 calls "time per output
token" at B=1 and "time per step" at B=8.

Run: python benchmarks/gpu/bench_hf.py [--models 0.8B,9B,35B-A3B] [--deadline-s 120] [--out DIR]
     python benchmarks/gpu/bench_hf.py --smoke   # the same code paths on a CPU: tiny dense and MoE shapes
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import load_results, print_hf_table, print_side_by_side  # noqa: E402
from runlog import Run, bench_arguments  # noqa: E402
from shapes import _COMMON, SHAPES  # noqa: E402


@dataclass(frozen=True)
class Settings:
    device: str = "cuda"
    batches: tuple[int, ...] = (1, 8)
    prompt: int = 512
    new_tokens: int = 32
    prefill: tuple[int, ...] = (2048, 8192)


SMOKE = Settings(device="cpu", batches=(1, 2), prompt=16, new_tokens=4, prefill=(32, 64))
# a model is started only with this many seconds left (build, first-call compiles and autotuning, one decode)
MIN_SECONDS = {"0.8B": 25, "9B": 30, "35B-A3B": 45, "tiny": 1, "tiny-moe": 1}
LOCAL_SHAPES = {  # --smoke only: the MoE code path at a CPU size
    "tiny-moe": dict(SHAPES["tiny"], model_type="qwen3_5_moe_text", num_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=32, shared_expert_intermediate_size=32, tie_word_embeddings=False),
}
GDN_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                 "causal_conv1d_update")


def hf_config(name: str):
    """The transformers text config of a shapes.py shape (its keys are HF's; the layer pattern made explicit)."""
    d = {**_COMMON, **SHAPES.get(name, LOCAL_SHAPES.get(name, {}))}
    moe = d.pop("model_type") == "qwen3_5_moe_text"
    d.pop("mtp_num_hidden_layers", None)  # the CausalLM carries no MTP head
    every = d.pop("full_attention_interval")
    d["layer_types"] = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                        for i in range(d["num_hidden_layers"])]
    if moe:
        from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

        return Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig(**d)
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    return Qwen3_5ForCausalLM, Qwen3_5TextConfig(**d)


def kernel_paths(model) -> dict:
    """Which function each GDN entry point of the model's modeling module runs: fla's kernels or the torch
    fallbacks (transformers resolves them when the module is imported, so fla must be importable before)."""
    module = importlib.import_module(type(model).__module__)
    out = {}
    for name in GDN_FUNCTIONS:
        fn = getattr(module, name, None)
        impl = fn
        for _ in range(4):  # the fallback wrapper keeps the resolved function as `implementation` in its closure
            cells = dict(zip(getattr(impl, "__code__", None) and impl.__code__.co_freevars or (),
                             (c.cell_contents for c in getattr(impl, "__closure__", None) or ())))
            if "implementation" in cells:
                impl = cells["implementation"]
                break
            impl = getattr(impl, "__wrapped__", None)
            if impl is None:
                break
        impl = impl or fn
        out[name] = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__name__', '?')}" if impl else "absent"
    out["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    out["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    return out


@torch.no_grad()
def randomize(model, gain: float = 0.25, seed: int = 0) -> None:
    """shapes.random_source's scheme on HF's parameters, in place on the device: projections std
    gain/sqrt(fan_in) (fan_in is the last dim, experts included), embeddings and convolutions std 0.02, A_log with
    decay rates in [1, 16]; 1-D parameters keep HF's init (zero-centred norms, ones for the gated norm and dt)."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty(p.shape, device=p.device).uniform_(1.0, 16.0, generator=gen).log_())
        elif p.dim() >= 2:
            std = 0.02 if ("embed_tokens" in name or "conv1d" in name) else gain * p.shape[-1] ** -0.5
            p.normal_(0.0, std, generator=gen)


def build(name: str, s: Settings):
    cls, cfg = hf_config(name)
    if s.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with torch.device(s.device):
        model = cls._from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    randomize(model)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    sync(s.device)
    return model


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(device: str, fn) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def generate(model, ids: torch.Tensor, n: int):
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, num_beams=1)


def bench_decode(run: Run, name: str, model, entry: dict) -> None:
    s = run.s
    rows = entry.setdefault("decode", [])
    vocab = model.config.vocab_size
    for B in s.batches:
        ids = torch.randint(0, vocab, (B, s.prompt), device=s.device)
        warm = timed(s.device, lambda: generate(model, ids, 2))  # first calls compile and autotune the kernels
        t1 = min(timed(s.device, lambda: generate(model, ids, 1)) for _ in range(2))
        step_guess = max(timed(s.device, lambda: generate(model, ids, 2)) - t1, 1e-3)
        n = s.new_tokens
        while n > 4 and t1 + n * step_guess > run.left() - 10:
            n //= 2
        if t1 + n * step_guess > run.left() - 5:
            run.results["skipped"].append(f"{name} decode B={B} (deadline)")
            continue
        out = None

        def go():
            nonlocal out
            out = generate(model, ids, n)

        tn = timed(s.device, go)
        assert out.shape == (B, s.prompt + n), out.shape
        step = (tn - t1) / (n - 1)
        rows.append({"B": B, "prompt": s.prompt, "new_tokens": n, "generate_s": tn, "first_token_s": t1,
                     "warmup_s": warm, "step_ms": step * 1e3, "ms_per_token": step * 1e3 / B,
                     "tok_s": B / step, "total_ms_per_step": tn / n * 1e3})
        run.save()


def bench_prefill(run: Run, name: str, model, entry: dict) -> None:
    s = run.s
    rows = entry.setdefault("prefill", [])
    vocab = model.config.vocab_size
    for T in s.prefill:
        if run.left() < 10:
            run.results["skipped"].append(f"{name} prefill T={T} (deadline)")
            continue
        ids = torch.randint(0, vocab, (1, T), device=s.device)
        logits = None

        def fwd():
            nonlocal logits
            logits = model(input_ids=ids, logits_to_keep=1).logits

        first = timed(s.device, fwd)
        times = [timed(s.device, fwd) for _ in range(2 if run.left() > 3 * first + 10 else 1)]
        ms = min(times) * 1e3
        rows.append({"T": T, "ms": ms, "tok_s": T / ms * 1e3, "first_call_ms": first * 1e3,
                     "logits_rows": int(logits.shape[1]), "finite": bool(torch.isfinite(logits).all())})
        run.save()


def bench_model(run: Run, name: str) -> None:
    entry = run.results["models"].setdefault(name, {})
    t = time.monotonic()
    model = build(name, run.s)
    entry.update(build_s=time.monotonic() - t, params=sum(p.numel() for p in model.parameters()),
                 kernels=kernel_paths(model))
    try:
        with torch.inference_mode():
            run.part(f"{name} decode", bench_decode, run, name, model, entry)
            if run.left() > 10:
                run.part(f"{name} prefill", bench_prefill, run, name, model, entry)
            else:
                run.results["skipped"].append(f"{name} prefill (deadline)")
        if run.s.device == "cuda":
            entry["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    finally:
        del model
        gc.collect()
        if run.s.device == "cuda":
            torch.cuda.empty_cache()


def fla_status() -> dict:
    """Whether fla imports (before transformers' Qwen3.5 modules do), and its version; import errors kept."""
    try:
        import fla

        return {"fla": getattr(fla, "__version__", "?")}
    except Exception as exc:  # noqa: BLE001 - any failure means transformers runs its torch fallbacks
        return {"fla": None, "fla_error": f"{type(exc).__name__}: {exc}"[:300]}


def main() -> int:
    ap = bench_arguments(120.0, "tiny dense and MoE shapes on the CPU")
    ap.add_argument("--new-tokens", type=int, default=Settings.new_tokens, help="decode tokens per timed generate")
    args = ap.parse_args()
    settings = SMOKE if args.smoke else Settings(new_tokens=max(args.new_tokens, 2))
    run = Run(args.deadline_s, args.out, settings, "bench_hf.json")
    run.results.update(fla_status())
    import transformers

    run.results["transformers"] = transformers.__version__
    if not run.need_cuda(args.smoke, print_hf_table):
        return 1
    run.each_model(["tiny", "tiny-moe"] if args.smoke else args.models.split(","), MIN_SECONDS, bench_model)
    print_hf_table(run.results)
    ours = load_results(args.out, "bench_fast.json")
    if ours is not None:
        print_side_by_side(ours, run.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
