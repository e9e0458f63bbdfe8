"""Real Qwen3.5 shapes (qwen35-architecture.md section 1.2), random bf16 weights made directly on the device, and
random prompts.

Weights are generated parameter by parameter on the GPU (never on the host, never downloaded), so a 9B or 35B
model is ready in seconds. Timing needs only finite values in a realistic range; the parity check also needs the
same value for the same name, whatever the order of requests.
"""

from __future__ import annotations

import zlib

import torch

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.params import TEXT, logical_parameters

_COMMON = {
    "vocab_size": 248320, "head_dim": 256, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    "max_position_embeddings": 262144, "full_attention_interval": 4, "mtp_num_hidden_layers": 1,
}

SHAPES = {
    "0.8B": dict(model_type="qwen3_5_text", num_hidden_layers=24, hidden_size=1024, num_attention_heads=8,
                 num_key_value_heads=2, intermediate_size=3584, linear_num_value_heads=16, tie_word_embeddings=True),
    "9B": dict(model_type="qwen3_5_text", num_hidden_layers=32, hidden_size=4096, num_attention_heads=16,
               num_key_value_heads=4, intermediate_size=12288, linear_num_value_heads=32, tie_word_embeddings=False),
    "35B-A3B": dict(model_type="qwen3_5_moe_text", num_hidden_layers=40, hidden_size=2048, num_attention_heads=16,
                    num_key_value_heads=2, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                    shared_expert_intermediate_size=512, linear_num_value_heads=32, tie_word_embeddings=False),
    # for --smoke runs of the benchmark on a CPU
    "tiny": dict(model_type="qwen3_5_text", num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, intermediate_size=128, linear_num_value_heads=4,
                 linear_num_key_heads=2, linear_key_head_dim=32, linear_value_head_dim=32, vocab_size=512,
                 tie_word_embeddings=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                  "mrope_section": [3, 3, 2], "mrope_interleaved": True}),
}
# the agent benchmark's --smoke run: the tiny shape with the real vocabulary (the Frontend's tokenizer emits its ids)
SHAPES["tiny-vocab"] = {**SHAPES["tiny"], "vocab_size": 248320}


def config(name: str) -> Qwen35Config:
    return Qwen35Config.from_hf({**_COMMON, **SHAPES[name]})


def random_source(cfg: Qwen35Config, device: torch.device | str, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                  gain: float = 0.25, features: tuple[str, ...] = (TEXT,)):
    """``source(logical_name)`` for ``load_fast_weights``: a random device tensor, the same for the same name
    whatever the call order (so the parity check can rebuild any weight). Projections get std
    gain/sqrt(fan_in), which keeps activations tame through 40 layers; norms are zero-centred (the GDN gated norm's
    plain weight is one); A_log gives decay rates exp(A_log) in [1, 16] like HF's init. `features` adds groups
    (MTP: the MTP head's weights)."""
    specs = logical_parameters(cfg, features)

    def source(name: str) -> torch.Tensor:
        spec = specs[name]
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        if spec.kind == "fp32":
            t = torch.empty(spec.shape, device=device, dtype=torch.float32)
            if name.endswith("A_log"):
                return t.uniform_(1.0, 16.0, generator=gen).log_()
            return t.normal_(0.0, 0.1, generator=gen)
        if spec.kind == "norm":
            one = name.endswith("linear_attn.norm.weight")
            return torch.full(spec.shape, 1.0 if one else 0.0, device=device, dtype=dtype)
        std = 0.02 if spec.kind in ("embedding", "conv") else gain * spec.shape[-1] ** -0.5
        return torch.empty(spec.shape, device=device, dtype=dtype).normal_(0.0, std, generator=gen)

    return source


def published_drafter(cfg: Qwen35Config, kind: str = "dflash", block_size: int = 16):
    """A DFlash / DFlash2 drafter of the published geometry for `cfg` (z-lab's Qwen3.5 drafters): 5 Qwen3 layers
    at the target's hidden size, head_dim 128 (the tiny shape: half its hidden), 4 query heads per KV head, an
    MLP of 3x hidden, the taps spread over the target's layers; DFlash2 with the released module sizes (2 taps,
    groups of 16, selector rank 256 and top-16; smaller on the tiny shape)."""
    from ninfer.models.qwen3_5.drafter import DrafterConfig
    from ninfer.testing.drafters import drafter_hf_config

    H = cfg.hidden_size
    d = min(128, H // 2)
    nh = H // d
    raw = drafter_hf_config(cfg, kind, layers=5, block_size=block_size, num_attention_heads=nh,
                            num_key_value_heads=max(1, nh // 4), head_dim=d, intermediate_size=3 * H)
    if kind == "dflash2" and H >= 1024:
        raw["dflash_config"].update(conv_group_size=16, selector_rank=256, selector_top_k=16)
    return DrafterConfig.from_hf(raw)


def random_drafter_source(drafter, device: torch.device | str, dtype: torch.dtype = torch.bfloat16, seed: int = 1,
                          gain: float = 0.25):
    """``source(logical_name)`` of a drafter's ``dflash.*`` weights, random on the device like `random_source`:
    plain RMSNorm weights of one, base kernels at the identity tap, projections of std gain/sqrt(fan_in)."""
    from ninfer.models.qwen3_5.drafter import drafter_parameters

    specs = drafter_parameters(drafter)

    def source(name: str) -> torch.Tensor:
        spec = specs[name]
        if spec.kind == "norm":
            return torch.ones(spec.shape, device=device, dtype=dtype)
        if name.endswith("base_kernel"):
            t = torch.zeros(spec.shape, device=device, dtype=dtype)
            t[:, 0] = 1.0
            return t
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        std = 1.0 if spec.kind == "embedding" else gain * spec.shape[-1] ** -0.5
        return torch.empty(spec.shape, device=device, dtype=dtype).normal_(0.0, std, generator=gen)

    return source


def random_prompt(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    # ids from 1000 up: clear of the special and control tokens of any real vocabulary
    return torch.randint(min(1000, vocab // 2), vocab, (n,), generator=gen).tolist()
