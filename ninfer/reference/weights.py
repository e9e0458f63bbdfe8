"""Weights glue: the reference model's logical weight map from a ``.ninfer`` artifact (the product path), or
directly from an HF checkpoint directory (an independent path that bypasses the converter, for cross-checks)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ninfer.artifact import Artifact, open_artifact
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.params import MTP, TEXT, VISION, logical_parameters

from .dflash import Drafter
from .model import ReferenceModel
from .vision import VisionTower

_TEXT_PREFIXES = ("model.language_model.", "model.")
_PER_EXPERT = re.compile(r"^(?P<base>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


def load_weights(artifact_path: str | Path, features: tuple[str, ...] = (TEXT, MTP),
                 dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every binding of the selected features as a tensor owned by the caller (values through the binding's
    format, so quantized artifacts work too): ``fp32``-kind parameters in at least fp32, the rest in ``dtype``.
    A tied lm_head comes back as the embedding tensor itself."""
    with open_artifact(artifact_path, features=features) as art:
        return _artifact_weights(art, dtype)


def load_model(artifact_path: str | Path, features: tuple[str, ...] = (TEXT, MTP),
               dtype: torch.dtype = torch.float32) -> ReferenceModel:
    """A :class:`ReferenceModel` of the artifact's config and weights."""
    with open_artifact(artifact_path, features=features) as art:
        return ReferenceModel(art.config, _artifact_weights(art, dtype), dtype=dtype)


def load_vision_tower(artifact_path: str | Path, dtype: torch.dtype = torch.float32) -> VisionTower:
    """The artifact's vision tower (its Vision bindings only)."""
    with open_artifact(artifact_path, features=(TEXT, VISION)) as art:
        weights = {n: art.dequantize(n).to(dtype) for n, b in art.bindings.items() if b.feature == VISION}
        return VisionTower(art.config.vision, weights, dtype)


def _artifact_weights(art: Artifact, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    out = {name: art.dequantize(name).to(wide if b.kind == "fp32" else dtype) for name, b in art.bindings.items()}
    if art.config.tie_word_embeddings:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


def hf_logical_name(key: str) -> str | None:
    """Checkpoint key -> logical name (``model.language_model.layers.0.x`` -> ``layers.0.x``); None for keys the
    text model does not use (the vision tower)."""
    if key.startswith("model.visual."):
        return None
    for p in _TEXT_PREFIXES:
        if key.startswith(p):
            return key[len(p):]
    return key


def _fuse_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert ``experts.{e}.{gate,up,down}_proj.weight`` -> fused ``gate_up_proj`` [E, 2Im, H], ``down_proj``."""
    groups: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        m = _PER_EXPERT.match(name)
        if m is None:
            out[name] = t
        else:
            groups.setdefault(m["base"], {})[(m["proj"], int(m["e"]))] = t
    for base, parts in groups.items():
        n = 1 + max(e for _, e in parts)
        try:
            out[f"{base}.gate_up_proj"] = torch.stack([torch.cat([parts["gate", e], parts["up", e]]) for e in range(n)])
            out[f"{base}.down_proj"] = torch.stack([parts["down", e] for e in range(n)])
        except KeyError as exc:
            raise KeyError(f"{base}: per-expert tensors incomplete, missing {exc.args[0]}") from None
    return out


def hf_config(checkpoint_dir: str | Path) -> Qwen35Config:
    return Qwen35Config.from_hf_file(Path(checkpoint_dir) / "config.json")


def weights_from_hf_dir(checkpoint_dir: str | Path, features: tuple[str, ...] = (TEXT, MTP),
                        dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Read every safetensors file of an HF checkpoint into the logical weight map (MoE experts fused).

    Only the logical parameters of ``features`` are kept; a tied lm_head is the embedding tensor itself.
    """
    from safetensors.torch import load_file

    src = Path(checkpoint_dir)
    cfg = hf_config(src)
    wanted = logical_parameters(cfg, features)
    tensors: dict[str, torch.Tensor] = {}
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{src}: no *.safetensors files")
    for f in files:
        for key, t in load_file(str(f)).items():
            name = hf_logical_name(key)
            if name is not None:
                tensors[name] = t
    tensors = _fuse_experts(tensors)
    if cfg.tie_word_embeddings or "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = tensors.get("embed_tokens.weight")
    missing = sorted(n for n in wanted if tensors.get(n) is None)
    if missing:
        raise KeyError(f"{src}: checkpoint lacks {len(missing)} parameter(s), first {missing[0]!r}")
    return {n: tensors[n].to(torch.float32 if wanted[n].kind == "fp32" and dtype != torch.float64 else dtype)
            for n in wanted}


def checkpoint_summary(checkpoint_dir: str | Path) -> str:
    """One line naming the architecture and geometry (for oracle reports)."""
    raw = json.loads((Path(checkpoint_dir) / "config.json").read_text())
    cfg = hf_config(checkpoint_dir)
    return (f"{raw.get('model_type')} {cfg.architecture}: L={cfg.num_hidden_layers} H={cfg.hidden_size} "
            f"HV/HK={cfg.linear_num_value_heads}/{cfg.linear_num_key_heads} tie={cfg.tie_word_embeddings} "
            f"mtp={cfg.mtp_num_hidden_layers} vocab={cfg.vocab_size}")


def load_drafter(artifact_path: str | Path, model: ReferenceModel, kind: str) -> Drafter:
    """The artifact's `kind` drafter (``dflash.*`` bindings and its config) over `model`'s embedding and lm_head,
    in the model's dtype."""
    with open_artifact(artifact_path, features=(TEXT, kind)) as art:
        weights = {n: art.dequantize(n) for n, b in art.bindings.items() if b.feature == kind}
        cfg = art.drafter
    return Drafter(cfg, weights, model.weights["embed_tokens.weight"], model.weights["lm_head.weight"], model.dtype)
