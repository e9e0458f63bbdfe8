"""Pipeline stages (docs/pipeline.md) on the CPU: the reference Program cut into two or three stages on one device
(`--devices cpu,cpu`) is token for token the single-stage Program under the property harness, with prefix hits,
cancellation, faults and MTP or DFlash speculation; a DFlash / DFlash2 drafter reading taps of both stages drafts
what one stage's does; a checkpoint that skips one stage's state is caught; the stage plan and the
per-device capacity refuse what cannot run, naming the flag and the bytes per device."""

import functools

import pytest
import torch
from hypothesis import settings

from ninfer.models.qwen3_5.config import FULL, LINEAR
from ninfer.pipeline import StageError, kv_pages_per_device, parse_devices, plan_stages, stage_memory
from ninfer.pipeline.plan import StageCapacityError, stage_weight_bytes
from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod
from ninfer.reference.model import ReferenceModel
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig
from ninfer.reference.program.stages import StagedPages, StagedSlots
from ninfer.sampling import SamplingParams
from ninfer.testing.drafters import reference_drafter
from ninfer.testing.harness import make_engine_machine
from ninfer.testing.serving import in_turns
from ninfer.testing.sessions import token_request
from ninfer.testing.siblings import sibling
from ninfer.testing.speculation import ForcedDrafts
from ninfer.testing.stages import assert_same_stores

LAYERS = (LINEAR, FULL, LINEAR, FULL)  # both stages of a 2,2 cut own GDN and attention layers


def _conftest():
    return sibling(__file__, "conftest.py")


@functools.cache
def _model(mtp: int = 0) -> ReferenceModel:
    conf = _conftest()
    cfg = conf.tiny_config(LAYERS, mtp=mtp)
    features = ("text", "mtp") if mtp else ("text",)
    return ReferenceModel(cfg, conf.tiny_weights(cfg, features=features), dtype=torch.float64)


def _program(devices=("cpu",), stage_layers=None, mtp: int = 0, k: int = 0, drafter: str | None = None
             ) -> ReferenceProgram:
    """`k` drafts by MTP (`mtp`), or by a random `drafter` kind ("dflash", "dflash2") tapping layer 1 (rank 0's in
    a 2,2 cut) and layer 2 (rank 1's: its taps cross to rank 0)."""
    method = SpeculativeMethod(drafter) if drafter else SpeculativeMethod.MTP
    config = ReferenceProgramConfig(max_concurrency=2, max_context=64, page_size=4, kv_pages=40, checkpoint_slots=2,
                                    host_bytes=1 << 16, dtype=torch.float64, eos_token_ids=(0,),
                                    speculative=SpeculativeConfig(method, k) if k else None,
                                    devices=devices, stage_layers=stage_layers)
    model = _model(mtp)
    return ReferenceProgram(model, config,
                            reference_drafter(model, drafter, target_layer_ids=[1, 2]) if drafter else None)


def _two() -> ReferenceProgram:
    return _program(("cpu", "cpu"))


def _three() -> ReferenceProgram:
    return _program(("cpu",) * 3, (1, 2, 1))


def _speculative(devices=("cpu", "cpu"), stage_layers=None) -> ReferenceProgram:
    return ForcedDrafts(_model(1)).install(_program(devices, stage_layers, mtp=1, k=3))


def _forced_dflash() -> ReferenceProgram:
    """DFlash with forced drafts (acceptance lengths 0..3): the drafter's context still follows every
    consumption, from taps of both stages."""
    return ForcedDrafts(_model()).install(_program(("cpu", "cpu"), k=3, drafter="dflash"))


def test_the_default_cut_balances_bytes_with_the_embedding_and_head_on_rank_0():
    cfg = _model().cfg
    plan = plan_stages(cfg, ("cpu",) * 3)
    assert plan.layers == (1, 1, 2)  # rank 0's embedding and head outweigh a layer
    bytes_ = stage_weight_bytes(cfg, plan.layers)
    for other in ((2, 1, 1), (1, 2, 1)):
        assert max(bytes_) <= max(stage_weight_bytes(cfg, other))
    assert plan.owned(2, cfg.attention_layers) == (3,) and plan.rank_of(1) == 1


@pytest.mark.parametrize("devices, layers, field", [
    (("cpu", "cpu"), (1, 2), "sum to the model's 4"), (("cpu", "cpu"), (4, 0), ">= 1 layer"),
    (("cpu", "cpu"), (2, 1, 1), "3 stages for 2 devices"), (("cpu",) * 5, None, "only 4 layers")])
def test_a_bad_split_is_refused_naming_the_flag(devices, layers, field):
    with pytest.raises(StageError, match=field):
        plan_stages(_model().cfg, devices, layers)


def test_devices_parse_ordinals_and_refuse_nonsense():
    assert parse_devices("0,1") == ("cuda:0", "cuda:1") and parse_devices("cpu, cpu") == ("cpu", "cpu")
    for bad, msg in (("0,gpu", "'gpu' is not a device"), ("cpu,0", "mixes"), (",".join("0" * 9), "1..8")):
        with pytest.raises(StageError, match=msg):
            parse_devices(bad)
    with pytest.raises(StageError, match="reference Program's stages run on the CPU"):
        _program(("cuda:0", "cuda:1"))


def test_kv_capacity_is_the_minimum_over_devices_and_a_short_device_names_its_bytes():
    cfg = _model().cfg
    mem = stage_memory(cfg, plan_stages(cfg, ("cuda:0", "cuda:1"), (2, 2)), page_size=16)
    fixed = [m.weight_bytes + 4 * m.slot_bytes for m in mem]
    budgets = [fixed[0] + 10 * mem[0].page_bytes, fixed[1] + 7 * mem[1].page_bytes]
    assert kv_pages_per_device(mem, budgets, slots=4) == 7
    # both ranks on one GPU (`--devices 0,0`) pool their needs against its one budget
    shared = stage_memory(cfg, plan_stages(cfg, ("cuda:0", "cuda:0"), (2, 2)), page_size=16)
    one = sum(fixed) + 5 * sum(m.page_bytes for m in shared)
    assert kv_pages_per_device(shared, [one, one], slots=4) == 5
    with pytest.raises(StageCapacityError, match=r"cuda:1 \(ranks 1\): \d+ bytes .* 100 available"):
        kv_pages_per_device(mem, [budgets[0], 100], slots=4)


def _equal_runs(make_one=_program, make_staged=_two) -> ReferenceProgram:
    """A greedy prompt, then a sampled and a greedy one that resume from its checkpoints, on one stage and on two:
    the same tokens, and every page and slot the same bytes. Returns the staged Program."""
    shared = tuple(range(3, 20))

    def batches():  # fresh requests per run: a TokenSession holds its request's output
        return [[token_request(shared + (5, 6), 8)],
                [token_request(shared + (7,), 8, seed=3, sampling=SamplingParams(temperature=1.0, top_k=5)),
                 token_request(shared + (5, 6, 9), 6)]]
    one, two = make_one(), make_staged()
    want = [[r.token_ids for r in b] for b in in_turns(one, batches(), max_concurrency=2)]
    got = in_turns(two, batches(), max_concurrency=2)
    assert [[r.token_ids for r in b] for b in got] == want
    assert got[1][1].usage.cached_prompt_tokens > 0  # the second turn resumed from a checkpoint
    assert_same_stores(one, two)
    return two


def test_two_stages_equal_one_stage_with_prefix_hits_sampling_and_one_link_pass_per_boundary():
    two = _equal_runs()
    assert two.link.passes > 0 and two.link.passes % 2 == 0  # to rank 1 and back, per forward pass
    assert len(two.pages.planes) == 2 and len(two.states.ranks) == 2


_MANY = settings(settings.default, max_examples=max(25, settings.default.max_examples // 40), stateful_step_count=30)
TwoStages = make_engine_machine(_two, max_concurrency=2, oracle=_program)
TwoStages.TestCase.settings = _MANY
TestTwoStagesEqualOne = TwoStages.TestCase

ThreeStages = make_engine_machine(_three, max_concurrency=2, oracle=_program, faults=False)
ThreeStages.TestCase.settings = settings(_MANY, max_examples=max(10, settings.default.max_examples // 100))
TestThreeStagesEqualOne = ThreeStages.TestCase

StagedMTP = make_engine_machine(_speculative, max_concurrency=2, oracle=lambda: _program(mtp=1))
StagedMTP.TestCase.settings = settings(_MANY, max_examples=max(15, settings.default.max_examples // 80))
TestStagedMTPEqualsOneStagePlain = StagedMTP.TestCase


def test_mtp_over_three_stages_with_an_attention_only_stage_equals_one_stage():
    """1,2,1: rank 2 holds layer 3 alone (attention only: no GDN slots of its own) and rank 0 layer 0 (GDN only:
    no KV plane of its own). Every round's backups, the checkpoints' slot copies and resets reach both empty stores
    and copy nothing; every rank's bytes equal one stage's."""
    staged = _equal_runs(lambda: _speculative(("cpu",)), lambda: _speculative(("cpu",) * 3, (1, 2, 1)))
    assert staged.states.ranks[2].layers == () and staged.pages.planes[0].layers == ()


def _last_rank_skipped(method: str, ranks: str):
    def bug(self, src, dst):
        for part in getattr(self, ranks)[:-1]:
            getattr(part, method)(src, dst)
    return bug


@pytest.mark.parametrize("owner, method, ranks", [(StagedSlots, "copy", "ranks"), (StagedPages, "copy_page", "planes")])
def test_a_checkpoint_missing_one_stages_state_is_caught(monkeypatch, owner, method, ranks):
    """The planted bugs: copying a slot (backups, captures, resumes) or a page (a resume's partial page) skips the
    last stage's share."""
    monkeypatch.setattr(owner, method, _last_rank_skipped(method, ranks))
    with pytest.raises(AssertionError, match=r"rank 1's (GDN slots|KV plane) differ|=="):
        _equal_runs()


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_drafter_over_two_stages_equals_one_stage(kind):
    """The drafter on rank 0 drafts from its context of taps of both stages (layer 2's cross from rank 1): the
    same drafts, so the same tokens (greedy and sampled, prefix hits), every page and slot the same bytes, and
    every slot's drafter context the single-stage one."""
    one, staged = _program(k=3, drafter=kind), _program(("cpu", "cpu"), k=3, drafter=kind)
    two = _equal_runs(lambda: one, lambda: staged)
    assert two.stage_plan.rank_of(2) == 1
    for slot, ctx in enumerate(one.states.backend):
        other = staged.states.ranks[0].backend[slot]
        assert (ctx is None) == (other is None), f"slot {slot}'s drafter context differs"
        if ctx is not None:
            assert (ctx.start, ctx.end) == (other.start, other.end) and \
                all(torch.equal(a.k, b.k) and torch.equal(a.v, b.v) for a, b in zip(ctx.kv, other.kv)), \
                f"slot {slot}'s drafter context differs"

StagedDFlash = make_engine_machine(_forced_dflash, max_concurrency=2, oracle=_program)
StagedDFlash.TestCase.settings = settings(_MANY, max_examples=max(10, settings.default.max_examples // 100))
TestStagedDFlashEqualsOneStagePlain = StagedDFlash.TestCase
