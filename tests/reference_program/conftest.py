"""A tiny random Qwen3.5 (vocab 97, hidden 32, GDN + attention layers) and Programs over it.

Helpers are fixtures because the suite imports test modules in importlib mode (no sibling imports).
"""

from __future__ import annotations


import pytest
import torch

from ninfer.models.qwen3_5.config import FULL, LINEAR, Qwen35Config
from ninfer.reference.model import ReferenceModel
from ninfer.testing.weights import peaked_text_tensors
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig

VOCAB = 97


def tiny_config(layers: tuple[str, ...] = (LINEAR, FULL, LINEAR), mtp: int = 0) -> Qwen35Config:
    return Qwen35Config.from_hf(dict(
        model_type="qwen3_5_text", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=len(layers),
        layer_types=list(layers), num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, intermediate_size=32, rms_norm_eps=1e-6, max_position_embeddings=4096,
        tie_word_embeddings=False, mtp_num_hidden_layers=mtp, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True}))


tiny_weights = peaked_text_tensors  # fp32 weights with peaked logits (ninfer.testing.checkpoints)


@pytest.fixture(scope="session")
def model32() -> ReferenceModel:
    cfg = tiny_config()
    return ReferenceModel(cfg, tiny_weights(cfg), dtype=torch.float32)


@pytest.fixture(scope="session")
def model64() -> ReferenceModel:
    cfg = tiny_config()
    return ReferenceModel(cfg, tiny_weights(cfg), dtype=torch.float64)


@pytest.fixture(scope="session")
def make_program(model32):
    def make(model=None, **kw) -> ReferenceProgram:
        m = model or model32
        base = dict(max_concurrency=2, max_context=256, page_size=4, kv_pages=160, checkpoint_slots=3,
                    host_bytes=1 << 20, dtype=m.dtype)
        base.update(kw)
        return ReferenceProgram(m, ReferenceProgramConfig(**base))
    return make


@pytest.fixture(scope="session")
def prompt_of():
    def make(n: int, seed: int = 0) -> tuple[int, ...]:
        g = torch.Generator().manual_seed(seed)
        return tuple(int(t) for t in torch.randint(1, VOCAB, (n,), generator=g))
    return make


@pytest.fixture(scope="session")
def mtp_model() -> ReferenceModel:
    """The tiny model with one MTP layer (peaked MTP weights too), fp32."""
    cfg = tiny_config(mtp=1)
    return ReferenceModel(cfg, tiny_weights(cfg, features=("text", "mtp")), dtype=torch.float32)


@pytest.fixture(scope="session")
def make_spec(mtp_model, make_program):
    """make_spec(k, forced=False, **config): the reference Program over `mtp_model` with the MTP backend drafting
    k tokens (k=0: no backend); `forced` puts ForcedDrafts (random acceptance lengths) in front of the drafter."""
    from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod
    from ninfer.testing.speculation import ForcedDrafts

    def make(k: int, forced: bool = False, adaptive: bool = True, draft_vocab: int | None = None,
             **kw) -> ReferenceProgram:
        spec = SpeculativeConfig(SpeculativeMethod.MTP, k, adaptive=adaptive, draft_vocab_size=draft_vocab) if k \
            else None
        program = make_program(mtp_model, speculative=spec, **kw)
        return ForcedDrafts(mtp_model).install(program) if forced else program
    return make


@pytest.fixture(scope="session")
def make_dflash(model32):
    """make_dflash(kind, k, forced=False, window=None, model=None, drafter=None, **config): the reference Program
    over the tiny model with a random `kind` drafter (block 16) drafting k tokens (k=0: no backend); `forced` puts
    ForcedDrafts in front of the drafter (the drafter context is still advanced by every consumption)."""
    from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod
    from ninfer.testing.drafters import reference_drafter
    from ninfer.testing.speculation import ForcedDrafts

    drafters = {}

    def make(kind: str, k: int, forced: bool = False, window: int | None = None, model=None, drafter=None,
             adaptive: bool = True, draft_vocab: int | None = None, **kw) -> ReferenceProgram:
        m = model or model32
        if drafter is None:
            drafter = drafters.get((kind, id(m))) or drafters.setdefault((kind, id(m)), reference_drafter(m, kind))
        spec = SpeculativeConfig(SpeculativeMethod(kind), k, window, adaptive, draft_vocab) if k else None
        base = dict(max_concurrency=2, max_context=256, page_size=4, kv_pages=160, checkpoint_slots=3,
                    host_bytes=1 << 20, dtype=m.dtype, speculative=spec)
        base.update(kw)
        program = ReferenceProgram(m, ReferenceProgramConfig(**base), drafter)
        return ForcedDrafts(m).install(program) if forced else program
    return make
