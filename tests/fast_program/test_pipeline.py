"""Pipeline stages of the fast Program (docs/pipeline.md): the model cut into two or three stages sharing one device
(`--devices cpu,cpu` with the naive kernels on the CPU; `0,0` with the Triton kernels and the decode graphs per rank
per exact B under NINFER_TEST_DEVICE=cuda) is token for token the single-stage Program, with every rank's KV plane and
GDN slots the single-stage pools' bytes, under greedy and sampled requests, prefix hits, MTP with forced drafts, a
DFlash / DFlash2 drafter on rank 0 reading taps of both stages, and the property harness; a copy that skips the last
stage's share is caught. The twin of
tests/reference_program/test_pipeline.py."""

import functools

import pytest
import torch
from hypothesis import settings

from ninfer.fast.program import FastProgram, FastProgramConfig
from ninfer.fast.program.config import GRAPHED_PREFILL_TOKENS
from ninfer.fast.program.stores import DeviceState
from ninfer.models.qwen3_5.config import FULL, LINEAR
from ninfer.models.qwen3_5.drafter import DrafterConfig
from ninfer.pipeline import StageError
from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod
from ninfer.reference.model import ReferenceModel
from ninfer.sampling import SamplingParams
from ninfer.testing.drafters import drafter_hf_config, drafter_tensors
from ninfer.testing.harness import make_engine_machine
from ninfer.testing.serving import in_turns
from ninfer.testing.sessions import token_request
from ninfer.testing.siblings import sibling
from ninfer.testing.speculation import ForcedDrafts
from ninfer.testing.stages import assert_same_pools

LAYERS = (LINEAR, FULL, LINEAR, FULL)  # both stages of a 2,2 cut own GDN and attention layers


@functools.cache
def _conftest():
    return sibling(__file__, "conftest.py")


@functools.cache
def _weights(mtp: int = 0):
    conf = _conftest()
    cfg = conf.tiny_config(mtp, LAYERS)
    return cfg, conf.tiny_weights(cfg, features=("text", "mtp") if mtp else ("text",))


@functools.cache
def _drafter(kind: str) -> DrafterConfig:
    """A random drafter tapping layer 1 (rank 0's in a 2,2 cut) and layer 2 (rank 1's: its taps cross)."""
    return DrafterConfig.from_hf(drafter_hf_config(_weights()[0], kind, target_layer_ids=[1, 2]))


def _program(stages: int = 1, stage_layers=None, mtp: int = 0, k: int = 0, prefill_graphs: bool = False,
             drafter: str | None = None) -> FastProgram:
    """`k` drafts by MTP (`mtp`), or by a `drafter` kind ("dflash", "dflash2") when one is named."""
    conf = _conftest()
    cfg, weights = _weights(mtp)
    method = SpeculativeMethod(drafter) if drafter else SpeculativeMethod.MTP
    config = FastProgramConfig(max_concurrency=2, max_context=64, page_size=4, kv_pages=40, checkpoint_slots=2,
                               host_bytes=1 << 16, dtype=torch.float32, eos_token_ids=(0,),
                               speculative=SpeculativeConfig(method, k, adaptive=False) if k else None,
                               devices=conf.stage_devices_for(stages) if stages > 1 else None,
                               stage_layers=stage_layers,
                               # the short pieces' graphs pad a piece, which rounds otherwise: both runs alike
                               prefill_graph_tokens=GRAPHED_PREFILL_TOKENS if prefill_graphs else 0)
    source = weights if drafter is None else {**weights, **drafter_tensors(_drafter(drafter), 1)}
    return FastProgram.build(cfg, source.__getitem__, config, budget_bytes=conf.BUDGET, device=conf.DEVICE,
                             kernels="triton" if conf.ON_GPU else "naive",
                             drafter=None if drafter is None else _drafter(drafter))


def _two() -> FastProgram:
    return _program(2)


def _three() -> FastProgram:
    return _program(3, (1, 2, 1))


@functools.cache
def _teacher(mtp: int = 1) -> ReferenceModel:
    cfg, weights = _weights(mtp)
    return ReferenceModel(cfg, weights, dtype=torch.float32)


def _speculative(stages: int = 2, stage_layers=None) -> FastProgram:
    return ForcedDrafts(_teacher()).install(_program(stages, stage_layers, mtp=1, k=3))


def _forced_dflash(stages: int = 2) -> FastProgram:
    """DFlash with forced drafts (acceptance lengths 0..3): the drafter's context still follows every
    consumption, from taps of both stages."""
    return ForcedDrafts(_teacher(0)).install(_program(stages, k=3, drafter="dflash"))


def _equal_runs(make_one=_program, make_staged=_two, plant=None) -> FastProgram:
    """A greedy prompt, then a sampled and a greedy one that resume from its checkpoints, then an unrelated one, on
    one stage and on more: the same tokens, and every pool the same bytes. Returns the staged Program
    (`plant(staged)` first)."""
    shared = tuple(range(3, 20))

    def batches():  # fresh requests per run: a TokenSession holds its request's output
        return [[token_request(shared + (5, 6), 8)],
                [token_request(shared + (7,), 8, seed=3, sampling=SamplingParams(temperature=1.0, top_k=5)),
                 token_request(shared + (5, 6, 9), 6)],
                [token_request((9, 4, 11, 2, 8, 30), 6)]]  # from position 0 on a slot a finished request held
    one, staged = make_one(), make_staged()
    if plant is not None:
        plant(staged)
    want = [[r.token_ids for r in b] for b in in_turns(one, batches(), max_concurrency=2)]
    got = in_turns(staged, batches(), max_concurrency=2)
    assert [[r.token_ids for r in b] for b in got] == want
    assert got[1][1].usage.cached_prompt_tokens > 0  # the second turn resumed from a checkpoint
    assert_same_pools(one, staged)
    return staged


def test_two_stages_equal_one_stage_with_prefix_hits_sampling_and_the_residual_pair_on_the_link():
    two = _equal_runs()
    assert two.link.passes > 0 and two.link.passes % 2 == 0  # h (and its delta) to rank 1 and back
    assert len(two.model.ranks) == 2 and len(two.store.ranks) == 2
    assert two.model.pools.k.shape[0] == 1 and two.model.ranks[1].conv.shape[0] == 1  # each rank its own layers
    assert two.stage_plan.layers == (2, 2)


def test_three_stages_equal_one_stage():
    three = _equal_runs(make_staged=_three)
    assert [p.k.shape[0] + p.conv.shape[0] for p in three.model.ranks] == [1, 2, 1]


def test_two_stages_equal_one_stage_through_the_prefill_graphs():
    """Short prefill pieces padded to a bucket (`prefill_graphs.py`: graphs on `0,0`, eager on the CPU) over every
    rank, the slot reset on each."""
    staged = _equal_runs(lambda: _program(prefill_graphs=True), lambda: _program(2, prefill_graphs=True))
    assert staged.pieces is not None and staged.model.plan.prefill_graph_tokens > 0


def test_mtp_with_forced_drafts_over_two_stages_equals_one_stage():
    """k = 3, acceptance lengths 0..3 forced: the round's verify and the MTP head's advance over two stages leave
    the single-stage bytes (the MTP layer and hidden on rank 0)."""
    staged = _equal_runs(lambda: _speculative(1), _speculative)
    assert staged.model.mtp is not None and staged.model.ranks[1].mtp_hidden is None


def test_mtp_over_three_stages_with_an_attention_only_stage_equals_one_stage():
    """1,2,1: rank 2 holds layer 3 alone (attention only: an empty (0, slots, ...) GDN pool) and rank 0 layer 0
    (GDN only: its k/v pools hold the MTP layer alone). Every round's backups, the checkpoints' slot copies and the
    slot resets reach the empty pool and copy nothing; every rank's bytes equal one stage's."""
    staged = _equal_runs(lambda: _speculative(1), lambda: _speculative(3, (1, 2, 1)))
    assert staged.model.ranks[2].conv.shape[0] == 0 and staged.model.ranks[2].ssm.shape[0] == 0
    assert staged.model.pools.k.shape[0] == 1  # the MTP layer's


def _skip_last_rank(method: str):
    """Plant on a staged Program's store: `method` (a copy) reaches every rank but the last."""
    def plant(program: FastProgram) -> None:
        store = program.store
        partial = DeviceState(store.ranks[:-1])
        setattr(store, method, getattr(partial, method))
    return plant


@pytest.mark.parametrize("method", ["copy_slot", "copy_page"])
def test_a_copy_missing_the_last_stages_share_is_caught(method):
    """The planted bugs: copying a slot (backups, captures, resumes) or a page (a resume's partial page) skips the
    last stage's share."""
    with pytest.raises(AssertionError, match=r"rank 1's pools differ|=="):
        _equal_runs(plant=_skip_last_rank(method))


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_drafter_over_two_stages_equals_one_stage(kind):
    """The drafter on rank 0 drafts from its context of taps of both stages (layer 2's cross from rank 1): the
    same drafts, so the same tokens (greedy and sampled, prefix hits), and its context pages the same bytes."""
    staged = _equal_runs(lambda: _program(k=3, drafter=kind), lambda: _program(2, k=3, drafter=kind))
    assert staged.model.tapped == {1, 2} and staged.stage_plan.rank_of(2) == 1


def test_stage_layers_with_one_device_are_refused_naming_the_flag():
    cfg, _ = _weights()
    with pytest.raises(StageError, match="--stage-layers: with one device"):
        FastProgramConfig(max_concurrency=2, max_context=64, stage_layers=(2, 2)).resolved(cfg)


def test_kv_capacity_is_planned_per_device_and_a_short_device_is_named_with_its_bytes():
    """The pages are the fewest any device holds beside its stages (`0,1` against stand-in budgets: nothing is
    allocated before the plan); one page of a staged plan is one stage's page, its weights the same total."""
    from ninfer.fast.memory import plan_memory
    from ninfer.pipeline import StageCapacityError

    cfg, weights = _weights()
    budget = 1 << 28  # the GPU's tiny model (hidden 256, vocab 1000) needs more workspace than the CPU's
    config = FastProgramConfig(max_concurrency=2, max_context=64, page_size=4, checkpoint_slots=2,
                               dtype=torch.float32, eos_token_ids=(0,), devices=("cuda:0", "cuda:1")).resolved(cfg)
    whole = plan_memory(cfg, budget, max_seqs=2, max_context=64, page_size=4, slots=config.usable_slots + 2,
                        dtype=torch.float32, max_prefill_tokens=config.max_prefill_tokens)
    wide = config.plan(cfg, [budget, budget])
    narrow = config.plan(cfg, [budget, budget * 3 // 4])
    assert (wide.page_bytes, wide.state_bytes, wide.weight_bytes) == (whole.page_bytes, whole.state_bytes,
                                                                  whole.weight_bytes)
    assert narrow.num_pages < wide.num_pages  # rank 1's device bounds the pool
    with pytest.raises(StageCapacityError, match=r"cuda:1 \(ranks 1\): \d+ bytes .* 1000 available"):
        FastProgram.build(cfg, weights.__getitem__, config, budget_bytes=[1 << 30, 1000], device="cuda:0",
                          kernels="naive")


# fewer examples than the single-stage harness: every example builds two Programs
_FEW = settings(settings.default, max_examples=max(15, settings.default.max_examples // 60), stateful_step_count=30)
TwoStages = make_engine_machine(_two, max_concurrency=2, oracle=_program)
TwoStages.TestCase.settings = _FEW
TestTwoStagesEqualOne = TwoStages.TestCase

StagedMTP = make_engine_machine(_speculative, max_concurrency=2, oracle=lambda: _program(mtp=1))
StagedMTP.TestCase.settings = settings(_FEW, max_examples=max(10, settings.default.max_examples // 100))
TestStagedMTPEqualsOneStagePlain = StagedMTP.TestCase

StagedDFlash = make_engine_machine(_forced_dflash, max_concurrency=2, oracle=lambda: _program())
StagedDFlash.TestCase.settings = settings(_FEW, max_examples=max(6, settings.default.max_examples // 160))
TestStagedDFlashEqualsOneStagePlain = StagedDFlash.TestCase
