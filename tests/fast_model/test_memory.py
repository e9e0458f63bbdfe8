"""The memory plan: KV pages from what the budget leaves, the dummy page/slot/row, and the allocated pools."""

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from _fast_setup import tiny_config
from ninfer.fast.memory import STEP_STATE_SHARE, plan_memory, sampling_bytes, spec_graph_bytes, workspace_bytes
from ninfer.fast.pools import allocate_pools
from ninfer.models.qwen3_5.capacity import gdn_state_bytes_per_sequence, kv_bytes_per_token_all_layers, weight_bytes

# budgets for tiny_config(), whose widths are real head dims on the GPU (its fp32 weights alone are ~20 MiB there)
BUDGET = 1 << (30 if ON_GPU else 26)


def test_kv_pool_gets_exactly_what_the_budget_leaves():
    cfg = tiny_config()
    kw = dict(max_seqs=3, max_context=50, page_size=4, dtype=torch.bfloat16, max_prefill_tokens=128)
    page = 4 * kv_bytes_per_token_all_layers(cfg, "bfloat16")
    fixed = (weight_bytes(cfg, "bfloat16") + 4 * gdn_state_bytes_per_sequence(cfg, "bfloat16") + 4 * 13 * 4
             + workspace_bytes(cfg, 128, 3, torch.bfloat16))
    plan = plan_memory(cfg, fixed + page * 101 + page - 1, **kw)
    # one page of the budget is the dummy page; a partial page is not a page
    assert plan.num_pages == 100 and plan.max_pages_per_seq == 13 and plan.max_context == 52
    assert plan.kv_bytes == 101 * page and plan.total_bytes == fixed + 101 * page
    assert (plan.dummy_page, plan.dummy_slot, plan.dummy_row) == (100, 3, 3)
    assert plan_memory(cfg, fixed + page * 101, max_kv_pages=20, **kw).num_pages == 20


def test_too_small_a_budget_names_what_is_missing():
    # The budget leaves about 10 KV pages after everything fixed; one 100-token sequence needs 25. Sized from the
    # config (which is larger on a GPU), not as a multiple of the weights.
    cfg = tiny_config()
    page = 4 * kv_bytes_per_token_all_layers(cfg, "float32")
    fixed = (weight_bytes(cfg, "float32") + 3 * gdn_state_bytes_per_sequence(cfg, "float32")
             + workspace_bytes(cfg, 64, 2, torch.float32))
    with pytest.raises(MemoryError, match="needs 25"):
        plan_memory(cfg, fixed + 10 * page, max_seqs=2, max_context=100, page_size=4, dtype=torch.float32,
                    max_prefill_tokens=64)


def test_the_mtp_rounds_graphs_take_their_buffers_and_scratch_off_the_pages():
    """An MTP backend's graphs (k = 3: verify blocks of 4 rows each) cost their fp32 logits, the draft's hidden and
    draws, one pass's transients in each pool, every row's scratch pages (the dummy row's too) and k step slots a row
    (the state after each block position but the last, stored hidden included); the KV pages get the rest, the k/v
    pools hold the scratch after the dummy page and the state pools the step slots after the dummy slot."""
    cfg = tiny_config()
    kw = dict(max_seqs=3, max_context=50, page_size=4, dtype=torch.float32, max_prefill_tokens=128, mtp=True)
    plain, spec = plan_memory(cfg, BUDGET, **kw), plan_memory(cfg, BUDGET, verify_width=4, **kw)
    graphs = spec_graph_bytes(cfg, 3, 4, torch.float32)
    # the verify logits and a pass's, a draft step's logits and the draws' q: all fp32 rows of the vocabulary
    assert graphs >= (2 * 12 + 3 + 3 * 3) * 4 * cfg.vocab_size
    assert (plain.verify_rows, spec.verify_rows, plain.scratch_pages, spec.scratch_pages) == (0, 12, 0, 2)
    assert spec.workspace_bytes - plain.workspace_bytes == graphs + 4 * 2 * plain.page_bytes
    assert (plain.step_slots, spec.step_slots, spec.state_slots) == (0, 3, plain.state_slots + 3 * 3)
    assert spec.slot_bytes == plain.slot_bytes == plain.state_bytes // (plain.slots + 1)
    assert spec.state_bytes - plain.state_bytes == 9 * plain.slot_bytes
    taken = (graphs + 8 * plain.page_bytes + 9 * plain.slot_bytes) / plain.page_bytes
    assert plain.num_pages - taken - 1 < spec.num_pages <= plain.num_pages - taken
    pools = allocate_pools(cfg, plan_memory(cfg, BUDGET // 4, verify_width=4, **kw), DEVICE)
    assert pools.k.shape[1] == pools.plan.num_pages + 1 + 4 * 2 == pools.scratch_page(3, 1) + 1
    plan = pools.plan
    assert pools.ssm.shape[1] == pools.conv.shape[1] == pools.mtp_hidden.shape[0] == plan.state_slots
    assert plan.step_slot(0, 0) == plan.dummy_slot + 1 and plan.step_slot(2, 2) == plan.state_slots - 1
    # past the rows' own k slots (the dummy row, a block longer than k + 1) no slot exists: refused on the host,
    # where on CUDA a kernel would write past the pools
    for row, j in ((plan.dummy_row, 0), (0, plan.step_slots), (-1, 0), (0, -1)):
        with pytest.raises(ValueError, match="step slot"):
            plan.step_slot(row, j)


def test_pools_have_the_planned_geometry_and_a_dummy_row():
    cfg = tiny_config()
    plan = plan_memory(cfg, BUDGET, max_seqs=2, max_context=16, page_size=4, dtype=torch.float32,
                       max_prefill_tokens=64, max_kv_pages=9)
    pools = allocate_pools(cfg, plan, DEVICE)
    assert pools.k.shape == (1, 10, 4, cfg.num_key_value_heads, cfg.head_dim) and pools.k.dtype == torch.float32
    assert pools.ssm.shape == (3, 3, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    assert pools.conv.shape == (3, 3, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1)
    assert pools.block_tables.shape == (3, 4) and pools.block_tables.dtype == torch.int32
    assert pools.block_tables[plan.dummy_row].tolist() == [9] * 4 and pools.block_tables[:2].eq(0).all()
    pools.ssm.fill_(1.0)
    pools.conv.fill_(1.0)
    pools.reset_slot(1)
    assert pools.ssm[:, 1].eq(0).all() and pools.conv[:, 1].eq(0).all() and pools.ssm[:, 0].eq(1).all()


def test_a_drafter_adds_its_weights_its_context_in_every_page_and_scratch():
    """Every page holds the drafter's context K/V in its own geometry (3 layers, 2 KV heads of 8 here, not the
    target's), each row gets scratch pages for a block starting anywhere in a page, and its weights count."""
    from ninfer.fast.drafter_memory import drafter_page_bytes, drafter_workspace_bytes, scratch_pages_per_row
    from ninfer.models.qwen3_5.drafter import DrafterConfig, drafter_parameters
    from ninfer.testing.drafters import drafter_hf_config

    cfg = tiny_config()
    drafter = DrafterConfig.from_hf(drafter_hf_config(cfg, "dflash2", layers=3, num_key_value_heads=2,
                                                      num_attention_heads=4, head_dim=8, block_size=16))
    kw = dict(max_seqs=3, max_context=50, page_size=4, dtype=torch.float32, max_prefill_tokens=128)
    plain, plan = plan_memory(cfg, BUDGET, **kw), plan_memory(cfg, BUDGET, drafter=drafter, **kw)
    assert drafter_page_bytes(drafter, 4, 4) == 2 * 3 * 4 * 2 * 8 * 4
    assert plan.page_bytes == plain.page_bytes + drafter_page_bytes(drafter, 4, 4)
    assert plan.weight_bytes == plain.weight_bytes + 4 * sum(p.numel for p in drafter_parameters(drafter).values())
    assert scratch_pages_per_row(drafter, 4) == 5 and plan.scratch_pages == 5  # 3 + 16 positions
    assert plan.workspace_bytes == plain.workspace_bytes + 3 * 5 * drafter_page_bytes(drafter, 4, 4) + \
        drafter_workspace_bytes(cfg, drafter, 128, 3, 4)
    pools = allocate_pools(cfg, plan, DEVICE)
    assert pools.dk.shape == (3, plan.num_pages + 1 + 3 * 5, 4, 2, 8) and pools.dv.shape == pools.dk.shape
    assert len(pools.page_pools()) == 4 and pools.scratch_page(2, 4) == plan.num_pages + 1 + 14
    assert plain.drafter is None and allocate_pools(cfg, plain, DEVICE).dk is None


def test_a_drafters_verify_graphs_count_their_blocks_and_taps():
    """DFlash's verify graphs (blocks of k + 1 = 16 rows each) cost their fp32 logits, a pass's transients and the
    target's taps of every row (the tapped layers' outputs, their concatenation, its projection and norm, one
    drafter layer's K/V); its draft graphs their draws (15 a row: fp32 z and 104 bytes each), a block pass of every
    row and a draw's transients, but no MTP draft graphs' buffers: the plan's workspace grows by exactly that and its
    rows are 3 blocks of 16. The 15 step slots a row while every row's take at most 1/8 of the budget; past that
    none, and a cut block replays (docs/speculative.md)."""
    from ninfer.models.qwen3_5.drafter import DrafterConfig
    from ninfer.testing.drafters import drafter_hf_config

    cfg = tiny_config()
    drafter = DrafterConfig.from_hf(drafter_hf_config(cfg, "dflash", layers=2, num_key_value_heads=2,
                                                      num_attention_heads=4, head_dim=8, block_size=16))
    kw = dict(max_seqs=3, max_context=50, page_size=4, dtype=torch.float32, max_prefill_tokens=128, drafter=drafter)
    eager, graphed = plan_memory(cfg, BUDGET, **kw), plan_memory(cfg, BUDGET, verify_width=16, **kw)
    graphs = spec_graph_bytes(cfg, 3, 16, torch.float32, drafter)
    verify = 48 * 4 * cfg.vocab_size + workspace_bytes(cfg, 1, 48, torch.float32) - sampling_bytes(cfg.vocab_size, 48)
    verify += 48 * 4 * -(-cfg.vocab_size // 32)  # the grammar rows of every verified position
    taps = 48 * 4 * ((2 * len(drafter.target_layer_ids) + 2) * cfg.hidden_size + 2 * 2 * 8)
    draws = 3 * 15 * (4 * cfg.vocab_size + 104)
    block = 48 * (4 * (2 * drafter.intermediate_size + 6 * cfg.hidden_size) + 8 * cfg.vocab_size)
    assert graphs == verify + taps + draws + block + 3 * 68 * cfg.vocab_size
    assert graphed.workspace_bytes - eager.workspace_bytes == graphs
    assert (eager.verify_rows, graphed.verify_rows, graphed.scratch_pages) == (0, 48, eager.scratch_pages)
    per_slot = gdn_state_bytes_per_sequence(cfg, "float32")
    assert graphed.step_slots == 15 and graphed.state_bytes == eager.state_bytes + 3 * 15 * per_slot
    assert eager.step_slots == 0
    # the budget at which the step states take exactly their share of what the weights (drafter's too) leave
    share = 3 * 15 * per_slot * STEP_STATE_SHARE + eager.weight_bytes
    assert plan_memory(cfg, share, verify_width=16, **kw).step_slots == 15
    assert plan_memory(cfg, share - 1, verify_width=16, **kw).step_slots == 0


def test_the_prefill_graphs_pool_is_planned():
    """The prefill graphs' private pool keeps the largest bucket's transients for good, beside the mixed graphs'
    decode rows (one per sequence): the plan counts it in the workspace, taken from the KV pages."""
    from ninfer.fast.memory import prefill_graph_bytes

    cfg = tiny_config()
    kw = dict(max_seqs=2, max_context=256, page_size=4, dtype=torch.bfloat16, max_prefill_tokens=1024)
    plain, graphed = plan_memory(cfg, BUDGET, **kw), plan_memory(cfg, BUDGET, prefill_graph_tokens=512, **kw)
    extra = prefill_graph_bytes(cfg, 512, torch.bfloat16, rows=2)
    assert extra > prefill_graph_bytes(cfg, 512, torch.bfloat16) > 0 and prefill_graph_bytes(cfg, 0, torch.bfloat16) == 0
    assert graphed.workspace_bytes == plain.workspace_bytes + extra and graphed.prefill_graph_tokens == 512
    assert graphed.num_pages < plain.num_pages
