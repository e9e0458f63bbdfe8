"""The embedded default model: a tiny seeded random-weight Qwen3.5 with the real vocabulary and Frontend files.

It lets every command run with no download: the real tokenizer, chat template and 248,320-row vocabulary, an MTP
head, and dims small enough to build in seconds and decode fast on a CPU. The weights are random, and the
artifact says so (``metadata.random_weights``), so a CLI can tell the user plainly that its output is noise.

The artifact is built once into the ninfer cache, named by a key over everything that shapes its content; the
artifact writer publishes it with an atomic rename, so concurrent builders each end with a valid file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator

import torch

from ninfer.cache import cache_dir
from ninfer.convert import tokenizer as qwen_tokenizer
from ninfer.convert.chat_template import TEMPLATE_SHA256, default_chat_template
from ninfer.models.qwen3_5.config import FULL, LINEAR, Qwen35Config
from ninfer.models.qwen3_5.params import ParamSpec, logical_parameters

NAME = "ninfer-default-random"
# Bump when the weights, config or resources below change, so a stale cached artifact is not reused.
RECIPE_VERSION = 1
SEED = 20261201
INIT_STD = 0.02
ENDOFTEXT, IM_END = 248044, 248046

HF_CONFIG = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "layer_types": [LINEAR, LINEAR, LINEAR, FULL],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 32,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    # rotary dim = 32 * 0.25 = 8, so the three MRoPE sections cover 4 frequency pairs.
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    "max_position_embeddings": 262144,
    "tie_word_embeddings": True,
    "mtp_num_hidden_layers": 1,
    "attn_output_gate": True,
    "attention_bias": False,
    "bos_token_id": None,
    "eos_token_id": ENDOFTEXT,
    "pad_token_id": ENDOFTEXT,
    "dtype": "bfloat16",
}

GENERATION_CONFIG = {"bos_token_id": ENDOFTEXT, "eos_token_id": [IM_END, ENDOFTEXT], "pad_token_id": ENDOFTEXT,
                     "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}

TOKENIZER_CONFIG = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
                    "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace",
                    "model_max_length": 262144, "split_special_tokens": False}


def default_config() -> Qwen35Config:
    return Qwen35Config.from_hf(HF_CONFIG)


def _init(spec: ParamSpec, gen: torch.Generator) -> torch.Tensor:
    """One parameter's initial value, by kind, in fp32."""
    if spec.kind == "fp32":
        if spec.name.endswith("A_log"):
            # Decay rates exp(A_log) spread over [1, 16], as in HF's GDN init.
            return torch.empty(spec.shape).uniform_(1.0, 16.0, generator=gen).log()
        return torch.randn(spec.shape, generator=gen) * 0.1
    noise = torch.randn(spec.shape, generator=gen) * INIT_STD
    if spec.kind == "norm":
        # The GDN gated norm multiplies by w; every other norm by (1 + w), so w is stored centred on zero.
        return noise + 1.0 if spec.name.endswith("linear_attn.norm.weight") else noise
    return noise


def random_tensors(cfg: Qwen35Config, seed: int = SEED) -> Iterator[tuple[str, torch.Tensor]]:
    """Seeded random weights for every logical parameter of ``cfg``, one at a time (bf16; fp32 kinds in fp32).

    A tied ``lm_head.weight`` is skipped: the writer binds it to the embedding's object.
    """
    gen = torch.Generator().manual_seed(seed)
    for name, spec in logical_parameters(cfg).items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        value = _init(spec, gen)
        yield name, value if spec.kind == "fp32" else value.to(torch.bfloat16)


def _resources() -> dict[str, bytes]:
    return {
        "tokenizer.json": qwen_tokenizer.build_qwen35_tokenizer_json().encode("utf-8"),
        "tokenizer_config.json": json.dumps(TOKENIZER_CONFIG, indent=2).encode("utf-8"),
        "chat_template.jinja": default_chat_template().encode("utf-8"),
        "generation_config.json": json.dumps(GENERATION_CONFIG, indent=2).encode("utf-8"),
        "config.json": json.dumps(HF_CONFIG, indent=2).encode("utf-8"),
    }


def recipe_key() -> str:
    """Short digest of everything that decides the artifact's content; part of its cache file name."""
    recipe = {"version": RECIPE_VERSION, "seed": SEED, "std": INIT_STD, "config": HF_CONFIG,
              "generation": GENERATION_CONFIG, "tokenizer_config": TOKENIZER_CONFIG,
              "tokenizer": [qwen_tokenizer.SOURCE_SHA256, qwen_tokenizer.RECIPE_VERSION], "template": TEMPLATE_SHA256}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode("utf-8")).hexdigest()[:12]


def cached_default_model_path() -> Path:
    return cache_dir() / "default" / f"{NAME}-r{RECIPE_VERSION}-{recipe_key()}.ninfer"


def build_default_model(path: Path, progress: bool = False) -> Path:
    """Write the default model artifact to ``path`` (atomically, via the artifact writer)."""
    from ninfer.artifact import write_artifact
    from ninfer.artifact.build import default_provenance

    cfg = default_config()
    metadata = {"name": NAME, "random_weights": True, "seed": SEED, "recipe_version": RECIPE_VERSION,
                "description": "tiny seeded random-weight Qwen3.5 with the real vocabulary; its output is noise"}
    path.parent.mkdir(parents=True, exist_ok=True)
    resources = _resources()
    # Same provenance shape as converted artifacts: a source record, the recipe, and each resource's origin.
    provenance = default_provenance(
        source={"generator": __name__, "seed": SEED},
        recipe={"name": NAME, "version": RECIPE_VERSION, "key": recipe_key()},
        resources={name: "builtin" for name in resources})
    return write_artifact(path, cfg, random_tensors(cfg), resources=resources, metadata=metadata,
                          provenance=provenance, progress=progress)


def default_model_path(progress: bool = False) -> Path:
    """Path of the embedded default model, building it into the ninfer cache on first use."""
    path = cached_default_model_path()
    if not path.is_file():
        build_default_model(path, progress=progress)
    return path

