"""Random DFlash / DFlash2 drafters in the published layout, for converter, loading and Program tests.

`drafter_hf_config` mirrors a published drafter's ``config.json`` (z-lab's keys: a Qwen3 geometry,
``num_target_layers``, ``block_size`` and ``dflash_config`` with the taps, the mask token and DFlash2's
convolution and selector sizes); `make_drafter_checkpoint` writes it with one ``model.safetensors`` under the
published tensor names (no embedding, no lm_head). `drafter_tensors` gives the same weights in memory, keyed by the
artifact's logical names (``dflash.*``), and `reference_drafter` a reference `Drafter` of them over a model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.drafter import PREFIX, DrafterConfig, DrafterKind, drafter_parameters

ARCH = {DrafterKind.DFLASH: "DFlashDraftModel", DrafterKind.DFLASH2: "DFlash2DraftModel"}


def drafter_hf_config(target: Qwen35Config, kind: DrafterKind | str = DrafterKind.DFLASH, *, layers: int = 2,
                      block_size: int = 16, mask_token_id: int | None = None, target_layer_ids: list[int] | None = None,
                      selector_top_k: int = 8, **overrides: Any) -> dict[str, Any]:
    """A published-layout drafter config for `target`: `layers` layers at its hidden size, 2 q heads and 1 kv
    head of hidden/2, the taps spread over the target's layers (DFlash2: 2 taps, groups of 8, rank 8,
    `selector_top_k` candidates); `overrides` replace top-level keys."""
    kind, H, L = DrafterKind(kind), target.hidden_size, target.num_hidden_layers
    extra: dict[str, Any] = {"mask_token_id": target.vocab_size - 1 if mask_token_id is None else mask_token_id,
                             "target_layer_ids": target_layer_ids or sorted({round(i * (L - 1) / max(layers - 1, 1))
                                                                             for i in range(layers)})}
    if kind is DrafterKind.DFLASH2:
        extra.update(conv_kernel_size=2, conv_group_size=8, selector_rank=8, selector_top_k=selector_top_k)
    raw = dict(architectures=[ARCH[kind]], model_type="qwen3", hidden_size=H, num_hidden_layers=layers,
               num_attention_heads=2, num_key_value_heads=1, head_dim=H // 2, intermediate_size=2 * H,
               rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=target.vocab_size, num_target_layers=L,
               block_size=block_size, max_position_embeddings=target.max_position_embeddings,
               tie_word_embeddings=False, attention_bias=False, dflash_config=extra)
    raw.update(overrides)
    return raw


def drafter_tensors(cfg: DrafterConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """fp32 weights keyed by logical name: norms near 1 (plain RMSNorm weights), projections of std
    1/sqrt(fan_in), base kernels near the identity tap (tap 0 = 1), codebooks of std 1."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, spec in drafter_parameters(cfg).items():
        if spec.kind == "norm":
            t = 1.0 + 0.1 * torch.randn(spec.shape, generator=g)
        elif name.endswith("base_kernel"):
            t = 0.1 * torch.randn(spec.shape, generator=g)
            t[:, 0] += 1.0
        elif spec.kind == "embedding":
            t = torch.randn(spec.shape, generator=g)
        else:
            t = torch.randn(spec.shape, generator=g) / math.sqrt(spec.shape[-1])
        out[name] = t
    return out


def make_drafter_checkpoint(out_dir: str | Path, target: Qwen35Config, kind: DrafterKind | str = DrafterKind.DFLASH,
                            *, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                            extra_tensors: dict[str, torch.Tensor] | None = None, drop: tuple[str, ...] = (),
                            **config: Any) -> Path:
    """Write a random drafter directory (config.json + model.safetensors, published names) and return it.
    `extra_tensors` and `drop` (published names) make malformed ones for refusal tests."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw = drafter_hf_config(target, kind, **config)
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    cfg = DrafterConfig.from_hf({k: v for k, v in raw.items() if k != "is_causal"})  # shapes even for a refused one
    tensors = {n.removeprefix(PREFIX): t.to(dtype).contiguous() for n, t in drafter_tensors(cfg, seed).items()}
    for name in drop:
        del tensors[name]
    tensors.update(extra_tensors or {})
    save_file(tensors, str(out / "model.safetensors"))
    return out


def reference_drafter(model, kind: DrafterKind | str = DrafterKind.DFLASH, seed: int = 1, **config: Any):
    """A random drafter of the published layout over a `ReferenceModel`'s embedding and lm_head, in its dtype."""
    from ninfer.reference.dflash import Drafter

    cfg = DrafterConfig.from_hf(drafter_hf_config(model.cfg, kind, **config))
    return Drafter(cfg, drafter_tensors(cfg, seed), model.weights["embed_tokens.weight"],
                   model.weights["lm_head.weight"], model.dtype)


def with_drafter(src: str | Path, out: str | Path, kind: DrafterKind | str = DrafterKind.DFLASH, *, seed: int = 1,
                 **config: Any) -> Path:
    """A copy of the dense artifact `src` with a random `kind` drafter bound beside its target (what
    ``ninfer convert --drafter`` stores), for tests that need a drafter on a model that has no HF directory
    (the embedded default model)."""
    from ninfer.artifact import open_artifact
    from ninfer.artifact.build import add_uses
    from ninfer.artifact.writer import ArtifactWriter
    from ninfer.models.qwen3_5.drafter import RESOURCE

    with open_artifact(src, features=None) as art:
        desc = art.descriptor
        cfg = DrafterConfig.from_hf(drafter_hf_config(art.config, kind, **config))
        with ArtifactWriter(Path(out), progress=False) as w:
            for b in desc.bindings:
                if b.object == b.name:
                    o = art.objects[b.name]
                    assert o.format == "dense", f"with_drafter copies dense artifacts only ({b.name}: {o.format})"
                    w.add_object(b.name, dtype=o.dtype, shape=o.shape, planes={"data": art.tensor(b.name)})
            for b in desc.bindings:
                w.bind(b.name, b.object, feature=b.feature, kind=b.kind)
            specs = drafter_parameters(cfg)
            for name, t in drafter_tensors(cfg, seed).items():
                w.add_object(name, dtype="float32", shape=tuple(t.shape), planes={"data": t})
                w.bind(name, name, feature=cfg.kind.value, kind=specs[name].kind)
            add_uses(w)
            for r in desc.resources:
                w.add_resource(r.name, art.resource(r.name), r.media_type)
            w.add_resource(RESOURCE, json.dumps(cfg.to_dict()), "application/json")
            return w.finish(desc.config, desc.metadata, desc.provenance)
