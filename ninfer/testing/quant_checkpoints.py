"""Tiny quantized HF checkpoints in the published layouts, written with numpy from :func:`make_hf_checkpoint`'s model.

Each writer quantizes the linear modules the way the producing tool stores them (block FP8 as in Qwen's FP8
releases, GPTQ v1 with act-order, AWQ GEMM, compressed-tensors pack-quantized, ModelOpt NVFP4), with fixed seeds,
and writes ``config.json``'s ``quantization_config``. They are independent of ninfer's converter: the tests convert
them and compare the artifact's dequantization with their own numpy dequantization of these tensors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.testing.checkpoints import make_hf_checkpoint, read_checkpoint_tensors
from ninfer.testing.weights import peaked_text_tensors

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# Modules the writers leave in bf16, as the published checkpoints do.
UNQUANTIZED = ("embed_tokens", "lm_head", "mlp.gate.weight", "shared_expert_gate", "in_proj_a", "in_proj_b", "norm")


def quantizable(key: str, t: torch.Tensor) -> bool:
    return key.endswith(".weight") and t.dim() == 2 and not any(u in key for u in UNQUANTIZED)


def pack_words(codes: np.ndarray, bits: int, axis: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    """uint codes -> int32 words along ``axis``: word i holds codes i*pf + order[j] at bits [bits*j, bits*j+bits)."""
    pf = 32 // bits
    order = order or tuple(range(pf))
    c = np.moveaxis(codes.astype(np.uint32), axis, -1)
    c = c.reshape(*c.shape[:-1], c.shape[-1] // pf, pf)
    w = np.zeros(c.shape[:-1], dtype=np.uint32)
    for j in range(pf):
        w |= c[..., order[j]] << np.uint32(bits * j)
    return np.ascontiguousarray(np.moveaxis(w, -1, axis)).view(np.int32)


def _fp16(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 1e-4).astype(np.float16)


def fp8_block(w: np.ndarray, block: tuple[int, int], bf16_scales: bool) -> dict[str, torch.Tensor]:
    br, bc = block
    n, k = w.shape
    nb, kb = -(-n // br), -(-k // bc)
    pad = np.zeros((nb * br, kb * bc), np.float32)
    pad[:n, :k] = np.abs(w)
    amax = pad.reshape(nb, br, kb, bc).max(axis=(1, 3))
    scale = np.maximum(amax / 448.0, 1e-8).astype(np.float32)
    if bf16_scales:
        scale = torch.from_numpy(scale).to(torch.bfloat16).float().numpy()
    full = np.repeat(np.repeat(scale, br, 0), bc, 1)[:n, :k]
    q = torch.from_numpy(np.clip(w / full, -448, 448)).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": torch.from_numpy(scale).to(torch.bfloat16 if bf16_scales else torch.float32)}


def _affine(wt: np.ndarray, groups: np.ndarray, ng: int, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric per-group quantization of wt [K, N] with group id per input row: codes, scales, zeros."""
    top = (1 << bits) - 1
    lo = np.stack([np.minimum(wt[groups == g].min(0), 0) for g in range(ng)])
    hi = np.stack([np.maximum(wt[groups == g].max(0), 0) for g in range(ng)])
    scales = _fp16((hi - lo) / top)
    zeros = np.clip(np.rint(-lo / scales.astype(np.float32)), 1, top).astype(np.uint32)
    q = np.clip(np.rint(wt / scales[groups].astype(np.float32)) + zeros[groups], 0, top).astype(np.uint32)
    return q, scales, zeros


def gptq(w: np.ndarray, bits: int, g: int, rng: np.random.Generator, act_order: bool) -> dict[str, torch.Tensor]:
    """GPTQ v1: qweight [K/pf, N], qzeros (zero - 1) [K/g, N/pf], scales [K/g, N], g_idx [K]."""
    k = w.shape[1]
    order = rng.permutation(k) if act_order else np.arange(k)
    g_idx = np.empty(k, np.int64)
    g_idx[order] = np.arange(k) // g
    q, scales, zeros = _affine(w.T, g_idx, k // g, bits)
    return {"qweight": torch.from_numpy(pack_words(q, bits, 0)),
            "qzeros": torch.from_numpy(pack_words(zeros - 1, bits, 1)),
            "scales": torch.from_numpy(scales), "g_idx": torch.from_numpy(g_idx.astype(np.int32))}


def awq(w: np.ndarray, g: int) -> dict[str, torch.Tensor]:
    """AWQ GEMM: qweight [K, N/8] and qzeros [K/g, N/8] in AWQ's column order, scales [K/g, N]."""
    k = w.shape[1]
    q, scales, zeros = _affine(w.T, np.arange(k) // g, k // g, 4)
    return {"qweight": torch.from_numpy(pack_words(q, 4, 1, AWQ_ORDER)),
            "qzeros": torch.from_numpy(pack_words(zeros, 4, 1, AWQ_ORDER)), "scales": torch.from_numpy(scales)}


def packed(w: np.ndarray, bits: int, g: int, symmetric: bool, rng: np.random.Generator, act_order: bool
           ) -> dict[str, torch.Tensor]:
    """compressed-tensors pack-quantized: weight_packed [N, K/pf] of q + 2^(b-1), weight_scale bf16 [N, K/g]."""
    n, k = w.shape
    half = 1 << (bits - 1)
    order = rng.permutation(k) if act_order else np.arange(k)
    g_idx = np.empty(k, np.int64)
    g_idx[order] = np.arange(k) // g
    if symmetric:
        amax = np.stack([np.abs(w[:, g_idx == j]).max(1) for j in range(k // g)], 1)
        scale = torch.from_numpy(np.maximum(amax / (half - 1), 1e-4).astype(np.float32)).to(torch.bfloat16)
        s = scale.float().numpy()
        u = np.clip(np.rint(w / s[:, g_idx]), -half, half - 1) + half
        zp = None
    else:
        q, s16, z = _affine(w.T, g_idx, k // g, bits)
        scale, u, zp = torch.from_numpy(s16.T.copy()).to(torch.bfloat16), q.T, z.T
    out = {"weight_packed": torch.from_numpy(pack_words(u.astype(np.uint32), bits, 1)), "weight_scale": scale,
           "weight_shape": torch.tensor([n, k], dtype=torch.int32)}
    if zp is not None:  # signed zero point, packed along the output dim with the same offset
        out["weight_zero_point"] = torch.from_numpy(pack_words(zp.astype(np.uint32), bits, 0))
    if act_order:
        out["weight_g_idx"] = torch.from_numpy(g_idx.astype(np.int32))
    return out


def nvfp4(w: np.ndarray, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """ModelOpt NVFP4: weight U8 [N, K/2], weight_scale e4m3 [N, K/16], weight_scale_2 and input_scale fp32."""
    amax = float(np.abs(w).max())
    g = np.float32(amax / (448.0 * 6.0))
    blocks = w.reshape(w.shape[0], -1, 16)
    scale = torch.from_numpy((np.abs(blocks).max(-1) / (6.0 * g)).astype(np.float32)).to(torch.float8_e4m3fn)
    eff = scale.float().numpy() * g
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    x = blocks / np.where(eff > 0, eff, 1)[..., None]
    idx = np.abs(np.minimum(np.abs(x), 6)[..., None] - grid).argmin(-1)
    codes = (idx | (np.signbit(x) << 3)).astype(np.uint8).reshape(w.shape)
    return {"weight": torch.from_numpy(codes[:, 0::2] | (codes[:, 1::2] << 4)), "weight_scale": scale,
            "weight_scale_2": torch.tensor(g), "input_scale": torch.tensor(np.float32(rng.uniform(0.01, 0.1)))}


def _writer(method: str, opts: dict[str, Any], rng: np.random.Generator) -> Callable[[np.ndarray], dict]:
    g = opts.get("group_size", 32)
    if method == "fp8":
        return lambda w: fp8_block(w, tuple(opts.get("block", (32, 32))), opts.get("bf16_scales", False))
    if method == "gptq":
        return lambda w: gptq(w, opts.get("bits", 4), g, rng, opts.get("act_order", True))
    if method == "awq":
        return lambda w: awq(w, g)
    if method == "compressed-tensors":
        return lambda w: packed(w, opts.get("bits", 4), g, opts.get("symmetric", True), rng,
                                opts.get("act_order", False))
    if method == "modelopt":
        return lambda w: nvfp4(w, rng)
    raise ValueError(method)


def quantization_config(method: str, opts: dict[str, Any]) -> dict[str, Any]:
    g, bits = opts.get("group_size", 32), opts.get("bits", 4)
    if method == "fp8":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(opts.get("block", (32, 32))), "modules_to_not_convert": ["lm_head"]}
    if method == "gptq":
        return {"quant_method": "gptq", "bits": bits, "group_size": g, "desc_act": opts.get("act_order", True),
                "sym": False, "checkpoint_format": "gptq"}
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": g, "version": "gemm", "zero_point": True}
    if method == "compressed-tensors":
        weights = {"num_bits": bits, "type": "int", "symmetric": opts.get("symmetric", True), "strategy": "group",
                   "group_size": g, "actorder": "group" if opts.get("act_order") else None}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}}}
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}


def make_quantized_checkpoint(dir: str | Path, method: str, *, moe: bool = False, seed: int = 0,
                              base: dict[str, Any] | None = None, **opts: Any) -> Path:
    """A tiny checkpoint of :func:`make_hf_checkpoint` (bf16, MoE experts per expert) with its linear modules in
    ``method``'s published layout (``fp8``, ``gptq``, ``awq``, ``compressed-tensors``, ``modelopt``). ``opts``:
    ``group_size`` (32), ``bits`` (4), ``act_order`` (GPTQ: True), ``symmetric`` (compressed-tensors), ``block``
    (FP8: (32, 32)), ``bf16_scales`` (FP8 ``weight_scale_inv`` in bf16); ``base``: more
    :func:`make_hf_checkpoint` arguments. Returns the directory."""
    out = Path(dir)
    make_hf_checkpoint(out, moe=moe, per_expert=True, dtype=torch.bfloat16, seed=seed, **(base or {}))
    tensors = read_checkpoint_tensors(out)
    rng = np.random.default_rng(seed)
    write = _writer(method, opts, rng)
    result: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        if not quantizable(key, t):
            result[key] = t
            continue
        prefix = key.removesuffix(".weight")
        for field, value in write(t.float().numpy()).items():
            result[f"{prefix}.{field}"] = value.contiguous()
    from safetensors.torch import save_file

    save_file(result, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = quantization_config(method, opts)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def write_peaked_checkpoint(out: str | Path, raw_config: dict[str, Any], seed: int = 0,
                            dtype: torch.dtype = torch.bfloat16) -> Path:
    """An HF checkpoint of any text geometry (``raw_config``, a text config.json dict) with
    :func:`peaked_text_tensors` weights in ``dtype`` (A_log/dt_bias fp32; experts in the fused keys), for recipe
    tests and quality reports on shapes the tiny transformers models do not have (e.g. 128-row-aligned heads)."""
    from safetensors.torch import save_file

    out = Path(out)
    cfg = Qwen35Config.from_hf(raw_config)
    tensors = {(n if n == "lm_head.weight" else f"model.{n}"):
               t.to(torch.float32 if n.endswith(("A_log", "dt_bias")) else dtype).contiguous()
               for n, t in peaked_text_tensors(cfg, seed=seed).items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(raw_config))
    return out
