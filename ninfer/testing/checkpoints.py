"""Tiny random HF Qwen3.5 checkpoints on disk, for converter tests and Program parity tests.

The weights come from ``transformers.Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` built with a fixed seed, so a
test can rebuild the same model in transformers and compare. transformers is a test-only dependency: it is imported
inside the functions, never at module import.

The safetensors files are written from the model's state dict ourselves rather than through ``save_pretrained``,
because transformers 5 rewrites fused MoE experts back into per-expert keys on save and drops ``mtp.*``; writing the
keys directly lets a test choose either expert layout and add the MTP head that HF does not know about.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.params import mtp_parameters
from ninfer.models.qwen3_5.vision_config import DEFAULT_PREPROCESSOR

# A byte-level tokenizer: ids 0..255 are the byte-level alphabet, the specials follow.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                  "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
EOS_TOKEN_ID = 258  # <|im_end|>
PAD_TOKEN_ID = 256  # <|endoftext|>
# The multimodal token ids of the tiny checkpoints (the specials above).
VISION_TOKEN_IDS = dict(vision_start_token_id=261, vision_end_token_id=262, image_token_id=263, video_token_id=264)

TINY_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tiny_text_config(*, moe: bool = False, tie: bool = False, mtp: bool = True, hv_per_hk: int = 2,
                     vocab: int = 512, num_layers: int = 4) -> dict[str, Any]:
    """HF text-config kwargs of a tiny model: H=64, 4 q heads / 2 kv heads of 32, rotary 8 (mrope [2, 1, 1])."""
    kw: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=2 * hv_per_hk,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=tie,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        bos_token_id=None, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID,
    )
    if moe:
        kw.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    else:
        kw.update(intermediate_size=128)
    return kw


def tiny_vision_config(*, depth: int = 2, out_hidden_size: int = 64) -> dict[str, Any]:
    """HF ``Qwen3_5VisionConfig`` kwargs of a tiny tower at the real patch geometry (patch 16, temporal 2, merge
    2): hidden 32, 2 heads of 16, a 6x6 learned position grid (so most images resample it)."""
    return dict(depth=depth, hidden_size=32, num_heads=2, intermediate_size=48, out_hidden_size=out_hidden_size,
                num_position_embeddings=36, hidden_act="gelu_pytorch_tanh", patch_size=16, temporal_patch_size=2,
                spatial_merge_size=2, in_channels=3)


# The tiny checkpoints' image processor: the released constants with small pixel bounds (64x64 .. 48 merged
# tokens), so test images stay a few dozen patches.
TINY_PREPROCESSOR = dict(DEFAULT_PREPROCESSOR, size={"shortest_edge": 64 * 64, "longest_edge": 32 * 32 * 48})


# Checkpoint layouts worth covering, as make_hf_checkpoint kwargs (the converter tests run each one).
VARIANTS: dict[str, dict[str, Any]] = {
    "dense": dict(),
    "dense_bf16_sharded_hv1": dict(dtype=torch.bfloat16, sharded=True, hv_per_hk=1),
    "dense_multimodal_tied": dict(multimodal=True, tie=True),
    "moe_per_expert_sharded": dict(moe=True, per_expert=True, sharded=True),
    "moe_fused_multimodal_bf16": dict(moe=True, multimodal=True, dtype=torch.bfloat16),
    "moe_tied_per_expert_nomtp": dict(moe=True, tie=True, per_expert=True, mtp=False),
}


def tiny_config(*, moe: bool = False, tie: bool = False, hv_per_hk: int = 2, vocab: int = 512, num_layers: int = 4,
                mtp: bool = True, multimodal: bool = False) -> Qwen35Config:
    """The Qwen35Config of :func:`make_hf_checkpoint` with the same arguments, without building anything."""
    raw = dict(tiny_text_config(moe=moe, tie=tie, hv_per_hk=hv_per_hk, vocab=vocab, num_layers=num_layers),
               model_type="qwen3_5_moe_text" if moe else "qwen3_5_text", mtp_num_hidden_layers=1 if mtp else 0)
    if multimodal:
        raw = _multimodal_config(raw, moe, tie)
    return Qwen35Config.from_hf(raw)


def _build_model(text_kw: dict[str, Any], moe: bool, seed: int, dtype: torch.dtype):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    hf_cfg = (Qwen3_5MoeTextConfig if moe else Qwen3_5TextConfig)(**text_kw)
    torch.manual_seed(seed)
    model = (Qwen3_5MoeForCausalLM if moe else Qwen3_5ForCausalLM)(hf_cfg)
    # Zero-centred norms are initialised to 0 by HF, which would hide a wrong (1 + w) in a parity test.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", ".bias")):  # HF zero-initialises biases too
                p.normal_(0.0, 0.1)
    return hf_cfg, model.to(dtype).eval()


def _text_tensors(model, tie: bool, per_expert: bool) -> dict[str, torch.Tensor]:
    """The model's state dict under HF checkpoint names (``model.*``, ``lm_head.weight``)."""
    out: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        if tie and k == "lm_head.weight":
            continue
        out[k] = v.detach().clone().contiguous()
    return _split_experts(out) if per_expert else out


def _split_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fused ``experts.gate_up_proj`` [E, 2Im, H] / ``down_proj`` [E, H, Im] -> per-expert ``{e}.{gate,up,down}_proj``."""
    out: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            base, im = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :im].clone()
                out[f"{base}{e}.up_proj.weight"] = v[e, im:].clone()
        elif k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = v[e].clone()
        else:
            out[k] = v
    return out


def _mtp_tensors(cfg: Qwen35Config, seed: int, dtype: torch.dtype, per_expert: bool,
                 std_weights: float = 0.02) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    out = {}
    for spec in mtp_parameters(cfg):
        std = 0.1 if spec.kind == "norm" else std_weights
        t = torch.randn(spec.shape, generator=g) * std
        out[spec.name] = t.to(torch.float32 if spec.kind == "fp32" else dtype)
    return _split_experts(out) if per_expert else out


def _vision_tensors(seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The state dict of a transformers ``Qwen3_5VisionModel`` of :func:`tiny_vision_config` built with ``seed + 2``
    (LayerNorm weights and every bias perturbed: HF initialises them to 1 and 0), under ``model.visual.*``."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    torch.manual_seed(seed + 2)
    tower = Qwen3_5VisionModel(Qwen3_5VisionConfig(**tiny_vision_config()))
    with torch.no_grad():
        for name, p in tower.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name == "pos_embed.weight":
                p.normal_(0.0, 0.5)  # visible against the patch embedding, so a wrong resampling shows
    return {f"model.visual.{k}": v.detach().to(dtype).contiguous() for k, v in tower.state_dict().items()}


def _multimodal_config(text_cfg: dict[str, Any], moe: bool, tie: bool) -> dict[str, Any]:
    text_cfg = dict(text_cfg, model_type="qwen3_5_moe_text" if moe else "qwen3_5_text")
    text_cfg.pop("architectures", None)
    vision = dict(tiny_vision_config(out_hidden_size=text_cfg["hidden_size"]),
                  model_type="qwen3_5_moe_vision" if moe else "qwen3_5_vision",
                  rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "text_config": text_cfg,
        "vision_config": vision,
        "tie_word_embeddings": tie,
        **VISION_TOKEN_IDS,
    }


def _write_safetensors(out: Path, tensors: dict[str, torch.Tensor], sharded: bool) -> None:
    from safetensors.torch import save_file

    if not sharded:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(tensors)
    n_shards = 3
    groups = [names[i::n_shards] for i in range(n_shards)]
    weight_map, total = {}, 0
    for s, group in enumerate(groups, start=1):
        fname = f"model-{s:05d}-of-{n_shards:05d}.safetensors"
        save_file({k: tensors[k] for k in group}, str(out / fname), metadata={"format": "pt"})
        for k in group:
            weight_map[k] = fname
            total += tensors[k].numel() * tensors[k].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_tiny_tokenizer(out: Path, *, chat_template_in_config: bool = False) -> None:
    """A byte-level BPE ``tokenizer.json`` (256 byte tokens + specials), tokenizer_config and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(out / "tokenizer.json"))
    tcfg: dict[str, Any] = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    if chat_template_in_config:
        tcfg["chat_template"] = TINY_CHAT_TEMPLATE
    else:
        (out / "chat_template.jinja").write_text(TINY_CHAT_TEMPLATE)
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))


def make_hf_checkpoint(dir: str | Path, *, moe: bool = False, tie: bool = False, multimodal: bool = False,
                       mtp: bool = True, mtp_std: float = 0.02, hv_per_hk: int = 2, sharded: bool = False, per_expert: bool = False,
                       vocab: int = 512, seed: int = 0, num_layers: int = 4, dtype: torch.dtype = torch.float32,
                       tokenizer: bool = True, chat_template_in_config: bool = False) -> Path:
    """Write a tiny random Qwen3.5 HF checkpoint directory and return its path.

    - ``moe``: Qwen3_5MoeForCausalLM (4 experts, top-2, shared expert) instead of the dense model.
    - ``tie``: ``tie_word_embeddings``; ``lm_head.weight`` is then absent from the files.
    - ``multimodal``: keys under ``model.language_model.*`` plus a real tiny ``model.visual.*`` tower built by
      transformers (:func:`tiny_vision_config`), and a nested ``qwen3_5``/``qwen3_5_moe`` config with
      ``text_config``, ``vision_config`` and the tiny tokenizer's vision token ids.
    - ``mtp``: add random ``mtp.*`` tensors (shapes of ``mtp_parameters``) and ``mtp_num_hidden_layers=1``; their
      matrices of std ``mtp_std`` (large enough, the head's attention visibly depends on positions).
    - ``sharded``: three ``model-0000k-of-00003.safetensors`` files plus ``model.safetensors.index.json``.
    - ``per_expert``: MoE experts as ``mlp.experts.{e}.{gate,up,down}_proj.weight`` instead of the fused form.
    - ``tokenizer``: write a byte-level ``tokenizer.json``, ``tokenizer_config.json`` and a chat template
      (``chat_template.jinja``, or the ``chat_template`` field when ``chat_template_in_config``).

    The text weights equal those of the transformers model built by :func:`load_hf_model` on the same directory.
    """
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    text_kw = tiny_text_config(moe=moe, tie=tie, mtp=mtp, hv_per_hk=hv_per_hk, vocab=vocab, num_layers=num_layers)
    hf_cfg, model = _build_model(text_kw, moe, seed, dtype)
    text_cfg = hf_cfg.to_dict()
    text_cfg["architectures"] = ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"]
    text_cfg["mtp_num_hidden_layers"] = 1 if mtp else 0
    text_cfg["dtype"] = str(dtype).removeprefix("torch.")
    tensors = _text_tensors(model, tie, per_expert)
    if mtp:
        tensors.update(_mtp_tensors(Qwen35Config.from_hf(text_cfg), seed, dtype, per_expert, mtp_std))
    if multimodal:
        tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
                   for k, v in tensors.items()}
        tensors.update(_vision_tensors(seed, dtype))
        config = _multimodal_config(text_cfg, moe, tie)
        (out / "preprocessor_config.json").write_text(json.dumps(TINY_PREPROCESSOR, indent=2))
    else:
        config = text_cfg
    _write_safetensors(out, tensors, sharded)
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str))
    gen = {"bos_token_id": PAD_TOKEN_ID, "eos_token_id": [EOS_TOKEN_ID, PAD_TOKEN_ID], "pad_token_id": PAD_TOKEN_ID,
           "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    if tokenizer:
        write_tiny_tokenizer(out, chat_template_in_config=chat_template_in_config)
    return out


def save_hf_checkpoint(dir: str | Path, text_kw: dict[str, Any], *, seed: int = 0,
                       edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A tiny dense checkpoint written by transformers itself: ``Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text_kw))``
    (norms perturbed as in :func:`make_hf_checkpoint`) through ``save_pretrained``, so ``config.json`` holds exactly
    what transformers writes; ``edit`` then changes that dict in place (to drop or rename fields the way older or
    hand-written configs do) before it is written back. No tokenizer files: converting gives the built-in ones."""
    out = Path(dir)
    _, model = _build_model(text_kw, False, seed, torch.float32)
    model.save_pretrained(str(out))
    if edit is not None:
        config = json.loads((out / "config.json").read_text())
        edit(config)
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def load_hf_model(dir: str | Path, dtype: torch.dtype = torch.float32):
    """The transformers CausalLM of a checkpoint written by :func:`make_hf_checkpoint` (multimodal ones included)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(dir), dtype=dtype).eval()


def load_hf_vlm(dir: str | Path, dtype: torch.dtype = torch.float32):
    """The transformers ``Qwen3_5(Moe)ForConditionalGeneration`` (tower included) of a multimodal checkpoint of
    :func:`make_hf_checkpoint`, with eager attention (sdpa on CPU differs in the last bits, not in meaning)."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(dir), dtype=dtype, attn_implementation="eager").eval()


def read_checkpoint_tensors(dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory under its file key (test helper; loads everything)."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(dir).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out
