"""Quality of each quantizing recipe against the same model in bf16 (reported, not gated).

    python benchmarks/quant_quality.py [--moe] [--tokens 512] [--seed 0] [--out results.json] [--smoke]

Builds a small random Qwen3.5 with peaked logits (``ninfer.testing.weights.peaked_text_tensors``: greedy tokens
are not near-ties), stores it as a bf16 HF checkpoint, converts it value-preserving and with ``--quantize fp8``,
``q4``, ``q5`` and ``nvfp4``, and runs one teacher-forced prefill of random tokens through the reference model of
each artifact (every representation dequantized exactly into fp32). Reports per recipe the stored bytes of the
quantized kinds, the logits' relative RMS error against bf16 and the top-1 agreement of the next-token argmax.
``--smoke`` runs a tiny model and a few tokens (the CPU CI check that the script works).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

RECIPES = ("fp8", "q4", "q5", "nvfp4")


def model_config(moe: bool, smoke: bool) -> dict:
    h, d = (64, 32) if smoke else (512, 128)
    raw = dict(model_type="qwen3_5_moe_text" if moe else "qwen3_5_text",
               architectures=["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"],
               vocab_size=512 if smoke else 4096, hidden_size=h, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=d, linear_num_key_heads=2, linear_num_value_heads=4,
               linear_key_head_dim=d, linear_value_head_dim=d, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
               max_position_embeddings=4096, tie_word_embeddings=False, mtp_num_hidden_layers=0,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
    if moe:
        raw.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=h // 2,
                   shared_expert_intermediate_size=h // 2)
    else:
        raw.update(intermediate_size=2 * h)
    return raw


def _logits(path: Path, tokens: torch.Tensor) -> torch.Tensor:
    from ninfer.reference.weights import load_model

    model = load_model(path, features=("text",))
    return model.prefill(tokens, model.new_state())


def _compare(path: Path, ids: torch.Tensor, base: torch.Tensor) -> dict:
    q = _logits(path, ids)
    return {"linear_bytes": _quantized_bytes(path),
            "rel_rms": float(((q - base).pow(2).mean() / base.pow(2).mean()).sqrt()),
            "top1_agreement": float((q.argmax(-1) == base.argmax(-1)).float().mean())}


def _quantized_bytes(path: Path) -> int:
    from ninfer.artifact import open_artifact

    with open_artifact(path) as art:
        objs = {b.object for b in art.bindings.values() if b.kind in ("linear", "experts")}
        return sum(art.objects[o].nbytes for o in objs)


def run(moe: bool, tokens: int, seed: int, smoke: bool, group_size: int) -> dict:
    from ninfer.convert.convert import convert_checkpoint
    from ninfer.testing.quant_checkpoints import write_peaked_checkpoint

    raw = model_config(moe, smoke)
    ids = torch.randint(0, raw["vocab_size"], (tokens,), generator=torch.Generator().manual_seed(seed + 1))
    with tempfile.TemporaryDirectory() as tmp:
        src = write_peaked_checkpoint(Path(tmp) / "src", raw, seed)
        base_path = convert_checkpoint(src, Path(tmp) / "bf16.ninfer", progress=False)
        base = _logits(base_path, ids)
        rows = {"bf16": {"linear_bytes": _quantized_bytes(base_path), "rel_rms": 0.0, "top1_agreement": 1.0}}
        # The scale of the numbers: the same random model with fp32 weights against its bf16 rounding.
        f32 = convert_checkpoint(write_peaked_checkpoint(Path(tmp) / "f32", raw, seed, torch.float32),
                                 Path(tmp) / "f32.ninfer", progress=False)
        rows["fp32 (scale)"] = _compare(f32, ids, base)
        for recipe in RECIPES:
            t0 = time.perf_counter()
            path = convert_checkpoint(src, Path(tmp) / f"{recipe}.ninfer", quantize=recipe, group_size=group_size,
                                      progress=False)
            rows[recipe] = {**_compare(path, ids, base), "seconds": round(time.perf_counter() - t0, 2)}
    return {"model": {k: raw[k] for k in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")},
            "tokens": tokens, "seed": seed, "group_size": group_size, "recipes": rows}


def table(result: dict) -> str:
    lines = [f"{result['model']['model_type']} H={result['model']['hidden_size']} "
             f"L={result['model']['num_hidden_layers']}, {result['tokens']} teacher-forced tokens, "
             f"seed {result['seed']}, q4/q5 group {result['group_size']}",
             "| recipe | linear+experts bytes | logits rel. RMS | top-1 agreement |", "|---|---|---|---|"]
    for name, r in result["recipes"].items():
        lines.append(f"| {name} | {r['linear_bytes']:,} | {r['rel_rms']:.4f} | {r['top1_agreement']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moe", action="store_true", help="the MoE model (experts quantized too)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--group-size", type=int, default=None, help="q4/q5 group (default 128; smoke 32)")
    ap.add_argument("--smoke", action="store_true", help="tiny model, 16 tokens")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    group = a.group_size or (32 if a.smoke else 128)
    result = run(a.moe, 16 if a.smoke else a.tokens, a.seed, a.smoke, group)
    print(table(result))
    if a.out is not None:
        a.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
