"""A tiny random Qwen3.5 (GDN + attention, eos 0) written as a .ninfer artifact, and fast and reference Programs
over the same weights.

On CPU the model has hidden 32 and vocab 97; the Programs run the "naive" kernels unless a test asks for "triton"
(the Triton interpreter costs ~1.5 s a model call, so only one Engine test pays for it). With
NINFER_TEST_DEVICE=cuda every fast Program runs the Triton kernels on the GPU, at real head dims. Helpers are
fixtures because the suite imports test modules in importlib mode (no sibling imports).
"""

from __future__ import annotations

import os

import pytest
import torch

from ninfer.artifact import write_artifact
from ninfer.fast.program import FastProgram, FastProgramConfig
from ninfer.models.qwen3_5.config import FULL, LINEAR, Qwen35Config
from ninfer.reference.model import ReferenceModel
from ninfer.testing.weights import peaked_text_tensors
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
VOCAB = 1000 if ON_GPU else 97
BUDGET = 1 << 30  # explicit byte budget: the pools are capped by kv_pages, not by the budget


def stage_devices_for(n: int) -> tuple[str, ...]:
    """`--devices` for n pipeline stages sharing the test device (`cpu,cpu`, or `0,0` on the GPU)."""
    return ("cuda:0" if ON_GPU else "cpu",) * n


def tiny_config(mtp: int = 0, layers: tuple[str, ...] = (LINEAR, FULL, LINEAR)) -> Qwen35Config:
    big = ON_GPU
    return Qwen35Config.from_hf(dict(
        model_type="qwen3_5_text", vocab_size=VOCAB, hidden_size=256 if big else 32, num_hidden_layers=len(layers),
        layer_types=list(layers), num_attention_heads=2, num_key_value_heads=1,
        head_dim=256 if big else 32, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=128 if big else 16, linear_value_head_dim=128 if big else 16, linear_conv_kernel_dim=4,
        intermediate_size=512 if big else 64, rms_norm_eps=1e-6, max_position_embeddings=4096,
        tie_word_embeddings=False, mtp_num_hidden_layers=mtp, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10] if big else [2, 1, 1], "mrope_interleaved": True}))


tiny_weights = peaked_text_tensors  # fp32 weights with peaked logits (ninfer.testing.checkpoints)


@pytest.fixture(scope="session")
def tiny():
    cfg = tiny_config()
    return cfg, tiny_weights(cfg)


@pytest.fixture(scope="session")
def artifact(tiny, tmp_path_factory):
    cfg, weights = tiny
    return write_artifact(tmp_path_factory.mktemp("fast_program") / "tiny.ninfer", cfg, weights.items())


PROGRAM_DEFAULTS = dict(max_concurrency=2, max_context=256, page_size=4, kv_pages=160, checkpoint_slots=3,
                        host_bytes=1 << 20, dtype=torch.float32)


@pytest.fixture(scope="session")
def make_fast(tiny):
    def make(kernels: str = "naive", **kw) -> FastProgram:
        cfg, weights = tiny
        config = FastProgramConfig(**{**PROGRAM_DEFAULTS, **kw})
        return FastProgram.build(cfg, weights.__getitem__, config, budget_bytes=BUDGET, device=DEVICE,
                                 kernels="triton" if ON_GPU else kernels)
    return make


@pytest.fixture(scope="session")
def stage_devices():
    return stage_devices_for


@pytest.fixture(scope="session")
def make_reference(tiny):
    cfg, weights = tiny
    model = ReferenceModel(cfg, weights, dtype=torch.float32)

    def make(**kw) -> ReferenceProgram:
        return ReferenceProgram(model, ReferenceProgramConfig(**{**PROGRAM_DEFAULTS, **kw}))
    return make


@pytest.fixture(scope="session")
def prompt_of():
    def make(n: int, seed: int = 0) -> tuple[int, ...]:
        g = torch.Generator().manual_seed(seed)
        return tuple(int(t) for t in torch.randint(1, VOCAB, (n,), generator=g))
    return make


@pytest.fixture(scope="session")
def tiny_mtp():
    """The tiny model with one MTP layer (peaked MTP weights too)."""
    cfg = tiny_config(mtp=1)
    return cfg, tiny_weights(cfg, features=("text", "mtp"))


@pytest.fixture(scope="session")
def mtp_reference_model(tiny_mtp):
    cfg, weights = tiny_mtp
    return ReferenceModel(cfg, weights, dtype=torch.float32)


@pytest.fixture(scope="session")
def make_fast_spec(tiny_mtp, mtp_reference_model):
    """make_fast_spec(k, forced=False, adaptive=False, kernels=None, **config): the fast Program over `tiny_mtp`
    with the MTP backend drafting k tokens (k=0: no backend); `forced` puts ForcedDrafts (random acceptance
    lengths) in front of the drafter; `adaptive` captures the draft policy's narrower verify widths (and, on CUDA,
    measures its costs: the tests pin the full block otherwise, so that a round's width never follows a timing);
    `kernels` the op table (None: Triton on the GPU, naive on the CPU)."""
    from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod
    from ninfer.testing.speculation import ForcedDrafts

    def make(k: int, forced: bool = False, adaptive: bool = False, draft_vocab: int | None = None,
             kernels: str | None = None, **kw) -> FastProgram:
        cfg, weights = tiny_mtp
        spec = SpeculativeConfig(SpeculativeMethod.MTP, k, adaptive=adaptive, draft_vocab_size=draft_vocab) if k \
            else None
        config = FastProgramConfig(**{**PROGRAM_DEFAULTS, **kw, "speculative": spec})
        program = FastProgram.build(cfg, weights.__getitem__, config, budget_bytes=BUDGET, device=DEVICE,
                                    kernels=kernels or ("triton" if ON_GPU else "naive"))
        return ForcedDrafts(mtp_reference_model).install(program) if forced else program
    return make


@pytest.fixture(scope="session")
def make_reference_spec(mtp_reference_model):
    """The reference Program over the same MTP weights (k=0: no backend)."""
    from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod

    def make(k: int, adaptive: bool = False, draft_vocab: int | None = None, **kw) -> ReferenceProgram:
        spec = SpeculativeConfig(SpeculativeMethod.MTP, k, adaptive=adaptive, draft_vocab_size=draft_vocab) if k \
            else None
        return ReferenceProgram(mtp_reference_model, ReferenceProgramConfig(**{**PROGRAM_DEFAULTS, **kw,
                                                                               "speculative": spec}))
    return make


@pytest.fixture(scope="session")
def make_fast_dflash(tiny):
    """make_fast_dflash(kind, k, forced=False, window=None, adaptive=False, budget_bytes=BUDGET, **config): the fast
    Program over `tiny` with a random `kind` drafter (block 16, seed 1: the reference's `reference_drafter`) drafting
    k tokens (k=0: no backend); `forced` puts ForcedDrafts in front of the drafter (the drafter context is still
    advanced); `adaptive` as make_fast_spec's."""
    from ninfer.models.qwen3_5.drafter import DrafterConfig
    from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod
    from ninfer.testing.drafters import drafter_hf_config, drafter_tensors
    from ninfer.testing.speculation import ForcedDrafts

    cfg, weights = tiny
    teacher = ReferenceModel(cfg, weights, dtype=torch.float32)

    def make(kind: str, k: int, forced: bool = False, window: int | None = None, adaptive: bool = False,
             draft_vocab: int | None = None, budget_bytes: int = BUDGET, **kw) -> FastProgram:
        drafter = DrafterConfig.from_hf(drafter_hf_config(cfg, kind))
        source = {**weights, **drafter_tensors(drafter, 1)}
        spec = SpeculativeConfig(SpeculativeMethod(kind), k, window, adaptive, draft_vocab) if k else None
        config = FastProgramConfig(**{**PROGRAM_DEFAULTS, **kw, "speculative": spec})
        program = FastProgram.build(cfg, source.__getitem__, config, budget_bytes=budget_bytes, device=DEVICE,
                                    kernels="triton" if ON_GPU else "naive", drafter=drafter)
        return ForcedDrafts(teacher).install(program) if forced else program
    return make


@pytest.fixture(scope="session")
def make_replaying_dflash(make_fast_dflash):
    """make_replaying_dflash(kind, k, **config): make_fast_dflash's Program under a budget that leaves its step
    states no room (their share of what the weights leave, `memory.verify_steps`: the 35B-A3B's beside a drafter on
    an H100), so a cut block replays its kept tokens; prefill pieces of 64 tokens keep the workspace under that
    share."""
    from ninfer.fast.memory import STEP_STATE_SHARE, gdn_state_bytes_per_sequence

    def make(kind: str, k: int, **kw) -> FastProgram:
        kw.setdefault("max_prefill_tokens", 64)
        plan = make_fast_dflash(kind, k, **kw).model.plan
        states = plan.max_seqs * k * gdn_state_bytes_per_sequence(make_fast_dflash(kind, 0).model.cfg,
                                                                  str(plan.dtype).removeprefix("torch."))
        program = make_fast_dflash(kind, k, budget_bytes=plan.weight_bytes + states * STEP_STATE_SHARE - 1, **kw)
        assert program.model.plan.step_slots == 0
        return program
    return make


@pytest.fixture(scope="session")
def make_reference_dflash(tiny):
    """The reference Program over the same weights and drafter (k=0: no backend)."""
    from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod
    from ninfer.testing.drafters import reference_drafter

    cfg, weights = tiny
    model = ReferenceModel(cfg, weights, dtype=torch.float32)

    def make(kind: str, k: int, window: int | None = None, adaptive: bool = False, draft_vocab: int | None = None,
             **kw) -> ReferenceProgram:
        spec = SpeculativeConfig(SpeculativeMethod(kind), k, window, adaptive, draft_vocab) if k else None
        return ReferenceProgram(model, ReferenceProgramConfig(**{**PROGRAM_DEFAULTS, **kw, "speculative": spec}),
                                reference_drafter(model, kind) if k else None)
    return make
