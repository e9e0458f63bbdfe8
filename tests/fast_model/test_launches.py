"""Launches per decode step, counted (``ninfer.testing.launches``: Triton launches and kernel-running torch ops)
through the interpreter on the tiny model, per layer kind and per op table.

"triton-fused" (opt-in): a GDN layer is 5 launches (in_proj with its norm, the GDN step, out_proj adding the
residual, gate_up with its norm and SwiGLU, down adding the residual), an attention layer 7 (qkv with its norm,
RoPE + KV write, attention and its split merge with the output gate, o_proj, gate_up, down). The shape rules send
the real 0.8B decode projections down the same fused paths (checked on meta tensors), so its step is those counts
over its 18 + 6 layers plus the step's own launches.

"triton" (the default, since the fused forms slowed the 0.8B step on the H200): every norm is the add + RMSNorm
kernel and every projection the plain GEMV or cuBLAS (at the tiny shapes cuBLAS, but for the SwiGLU GEMV): a GDN
layer is 7 launches, an attention layer 9 (the output gate stays in the attention kernel's store).

Both add the step's own 4 (KV addressing, embedding, final norm, lm_head; a bf16 model adds the logits' fp32
cast). Before any fusion: 7, 11 and 12-13.

An MoE block is 4 launches where the ``moe_decode`` op runs it (the default table at B=1, "triton-fused" at every
decode B) and 12 elsewhere; a decode graph captured per exact B keeps its B's path."""

from collections import Counter

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from _fast_setup import F, L, build_pair, place_sequences, tiny_config
from ninfer.fast.graph_runner import DecodeGraphRunner
from ninfer.fast.model import kernels as kernels_module
from ninfer.testing.host_syncs import count_host_syncs
from ninfer.testing.launches import LaunchCounter, count_step

I32 = dict(dtype=torch.int32, device=DEVICE)
# per op table: a GDN layer's, an attention layer's and an FFN's launches
LAUNCHES = {
    "triton-fused": (["_gemv_kernel", "_recurrent_kernel", "_gemv_kernel"],
                     ["_gemv_kernel", "_rope_kv_write_kernel", "_decode_kernel", "_merge_kernel", "_gemv_kernel"],
                     ["_gemv_kernel", "_gemv_kernel"]),
    "triton": (["_rmsnorm_kernel", "aten.mm", "_recurrent_kernel", "aten.mm"],
               ["_rmsnorm_kernel", "aten.mm", "_rope_kv_write_kernel", "_decode_kernel", "_merge_kernel", "aten.mm"],
               ["_rmsnorm_kernel", "_gemv_kernel", "aten.mm"]),
}
# the rows' block tables and KV slots, the embedding, the final norm and the lm_head (an fp32 model: no logits cast)
STEP = ["_decode_slots_kernel", "aten.embedding", "_rmsnorm_kernel", "aten.mm"]


@pytest.fixture(autouse=True)
def _poison_and_seed():
    # overrides the directory's NaN poisoning: its fills would be counted as launches; values are not checked here
    torch.manual_seed(7)
    yield


@pytest.mark.parametrize("kernels", sorted(LAUNCHES))
def test_decode_step_launches_per_layer(kernels):
    # a context capacity past 256 keys, so attention splits the keys and merges them (as at real context sizes)
    cfg = tiny_config()
    pair = build_pair(cfg, torch.float32, kernels, max_context=1024, page_size=16)
    slots, rows = place_sequences(pair.fast, 2)
    for s, r in zip(slots, rows):
        pair.fast.prefill(torch.arange(1, 3, device=DEVICE), s, r, 0)
    args = (torch.tensor([3, 4], device=DEVICE), torch.tensor(slots, **I32), torch.tensor(rows, **I32),
            torch.tensor([3, 3], **I32), torch.tensor([2, 2], **I32))
    pair.fast.decode(*args)
    counter = count_step(lambda: pair.fast.decode(*args))
    n_gdn, n_attn = len(cfg.linear_layers), len(cfg.attention_layers)
    gdn, attention, ffn = LAUNCHES[kernels]
    assert counter.names("gdn") == gdn * n_gdn
    assert counter.names("attention") == attention * n_attn
    assert counter.names("ffn") == ffn * (n_gdn + n_attn)
    assert counter.names("step") == STEP
    assert counter.syncs == []


def test_every_projection_through_the_gemv(monkeypatch):
    # kernels.GEMV_EVERY_PROJECTION (the all-Triton decode step's A/B): the default table's layers with each cuBLAS
    # projection a GEMV launch, the step's own launches (the lm_head among them) unchanged
    monkeypatch.setattr(kernels_module, "GEMV_EVERY_PROJECTION", True)
    cfg = tiny_config()
    pair = build_pair(cfg, torch.float32, "triton", max_context=1024, page_size=16)
    args = _decode_args(pair.fast, 2, 2)
    pair.fast.decode(*args)
    counter = count_step(lambda: pair.fast.decode(*args))
    gemv = lambda names: ["_gemv_kernel" if n == "aten.mm" else n for n in names]  # noqa: E731
    gdn, attention, ffn = LAUNCHES["triton"]
    assert counter.names("gdn") == gemv(gdn) * len(cfg.linear_layers)
    assert counter.names("attention") == gemv(attention) * len(cfg.attention_layers)
    assert counter.names("ffn") == gemv(ffn) * (len(cfg.linear_layers) + len(cfg.attention_layers))
    assert counter.names("step") == STEP


# an MoE block at decode: its norm and the router (cuBLAS at the tiny shape), then either the moe_decode op's two
# launches, which add the block to the stream themselves, or today's path: route, align, the two grouped GEMMs, the
# combine, the shared expert's SwiGLU GEMV and down projection and its gate (sigmoid, mul, add)
MOE_DECODE = ["_rmsnorm_kernel", "aten.mm", "_gate_up_kernel", "_down_kernel"]
MOE_UNFUSED = ["_rmsnorm_kernel", "aten.mm", "_route_kernel", "_align_kernel", "_grouped_gemm_kernel",
               "_grouped_gemm_kernel", "_combine_kernel", "_gemv_kernel", "aten.mm", "aten.sigmoid", "aten.mul",
               "aten.add"]
# per (op table, B): the default table takes moe_decode at one row only (on the H100 it beat today's path at B=1 and
# lost at B=2), "triton-fused" at every decode row count
MOE_FFN = {("triton", 1): MOE_DECODE, ("triton", 2): MOE_UNFUSED, ("triton-fused", 2): MOE_DECODE}


def _decode_args(model, B: int, length: int):
    """B sequences prefilled with ``length`` tokens; the decode step's arguments."""
    slots, rows = place_sequences(model, B)
    for s, r in zip(slots, rows):
        model.prefill(torch.arange(1, length + 1, device=DEVICE), s, r, 0)
    return (torch.arange(3, 3 + B, device=DEVICE), torch.tensor(slots, **I32), torch.tensor(rows, **I32),
            torch.full((B,), length + 1, **I32), torch.full((B,), length, **I32))


@pytest.mark.parametrize("kernels,B", sorted(MOE_FFN), ids=lambda v: str(v))
def test_moe_decode_step_launches_per_layer(kernels, B):
    # the GDN layer reads a stream an MoE block (the attention layer's) wrote. With "triton-fused" that block added
    # itself in place, so the layer's norm goes into its in_proj GEMV's prologue, as after a dense FFN
    cfg = tiny_config(moe=True, layers=(F, L))
    pair = build_pair(cfg, torch.float32, kernels)
    args = _decode_args(pair.fast, B, 2)
    pair.fast.decode(*args)
    counter = count_step(lambda: pair.fast.decode(*args))
    assert counter.names("ffn") == MOE_FFN[kernels, B] * 2
    gdn = LAUNCHES[kernels][0]
    assert counter.names("gdn") == (gdn if kernels == "triton-fused" else ["_rmsnorm_kernel"] + gdn[1:])
    assert counter.syncs == []


def test_graph_capture_takes_each_batch_sizes_moe_path():
    # the decode graph runner records one graph per exact B; the MoE rule is on shapes, so B = 1's graph holds
    # moe_decode and B = 2's today's path. On the GPU the capture itself is counted (one warm-up run, then the
    # recorded one); without CUDA capture is a no-op and the step it would record is counted
    cfg = tiny_config(moe=True, layers=(F,))
    model = build_pair(cfg, torch.float32, "triton").fast
    runner = DecodeGraphRunner(model, max_batch=2)
    plan = model.plan
    for B in (1, 2):
        runner.inputs.fill_dummy(B, plan.dummy_slot, plan.dummy_row)
        runner.body(B)  # autotuned kernels time their configurations on a first call
        if runner.use_graphs:
            counter, runs = count_step(lambda: runner.capture([B], warmup=1)), 2
            assert runner.can_use_graph(B)
        else:
            counter, runs = count_step(lambda: runner.body(B)), 1
        assert counter.names("ffn") == MOE_FFN["triton", B] * runs, B
        assert counter.syncs == []


# a prefill piece (one sequence, T tokens): a GDN layer is its norm, in_proj, the conv, the chunked rule's initial
# state copy and three passes (the state pass writes the final state into the slot), the gated norm and out_proj;
# attention its norm,
# qkv, RoPE + KV write, the flash kernel, the output gate (sigmoid, mul) and o_proj; an FFN norm, gate_up, SwiGLU,
# down. The step's own: the slot reset (start 0), the piece's positions and KV slots, the embedding, the final norm
# and the lm_head of the last token.
GDN_PREFILL = ["_rmsnorm_kernel", "aten.mm", "_conv_prefill_kernel", "aten.copy_", "_chunk_prep_kernel",
               "_chunk_state_kernel", "_chunk_output_kernel", "_gated_norm_kernel", "aten.mm"]
# padded to a graph bucket, the slot a device id: the window and S gathered from the slot and scattered back
GDN_PADDED = ["_rmsnorm_kernel", "aten.mm", "aten.index_select", "_conv_prefill_kernel", "aten.index_copy_",
              "aten.index_select", "aten.copy_", "_chunk_prep_kernel", "_chunk_state_kernel", "_chunk_output_kernel",
              "_gated_norm_kernel", "aten.index_copy_", "aten.mm"]
ATTENTION_PREFILL = ["_rmsnorm_kernel", "aten.mm", "_rope_kv_write_kernel", "_prefill_kernel", "aten.sigmoid",
                     "aten.mul", "aten.mm"]
FFN_PREFILL = ["_rmsnorm_kernel", "aten.mm", "_swiglu_kernel", "aten.mm"]
# a padded piece's attention on CUDA: the fixed grid of key-walk shares (grid_splits) and their softmax combine
ATTENTION_SPLIT = ATTENTION_PREFILL[:4] + ["aten.amax", "aten.sub", "aten.exp2", "aten.mul", "aten.sum", "aten.mul",
                                          "aten.sum", "aten.div", "aten.copy_"] + ATTENTION_PREFILL[4:]


def test_prefill_piece_launches_per_layer_and_reads_nothing_back():
    cfg = tiny_config(layers=(L, F))  # one layer of each kind: the counts are per layer
    pair = build_pair(cfg, torch.float32, "triton", max_context=1024, page_size=16)
    slots, rows = place_sequences(pair.fast, 3)
    tokens = torch.arange(1, 25, device=DEVICE)
    pair.fast.prefill(tokens, slots[0], rows[0], 0)
    counter = count_step(lambda: pair.fast.prefill(tokens, slots[1], rows[1], 0))
    n_gdn, n_attn = len(cfg.linear_layers), len(cfg.attention_layers)
    assert counter.names("gdn") == GDN_PREFILL * n_gdn
    assert counter.names("attention") == ATTENTION_PREFILL * n_attn
    assert counter.names("ffn") == FFN_PREFILL * (n_gdn + n_attn)
    assert len(counter.names("step")) <= 17 and counter.syncs == []
    # no host read inside the model call: not from a cached prefix, not with a checkpoint inside the piece (its
    # chunk table crosses through pinned memory, queued)
    with count_host_syncs() as seen:
        pair.fast.prefill(tokens[:8], slots[1], rows[1], 24)
        pair.fast.prefill(tokens, slots[2], rows[2], 0, captures=[(12, slots[0])])
    assert seen.sites == []
    # the graph body of a piece padded to its bucket: the same launches but for the slot's gathers and scatters,
    # and no read back (its length, slot, row and start are device data)
    ids = torch.zeros(64, **I32)
    ids[:24] = tokens
    args = (ids, torch.tensor([slots[1]], **I32), torch.tensor([rows[1]], **I32), torch.tensor([24], **I32),
            torch.tensor([24], **I32))
    pair.fast.prefill_piece(*args)  # a device length is another autotuner key of the GDN state pass: tuned here
    with count_host_syncs() as seen:
        counter = count_step(lambda: pair.fast.prefill_piece(*args))
    assert counter.names("gdn") == GDN_PADDED * n_gdn and counter.names("ffn") == FFN_PREFILL * (n_gdn + n_attn)
    assert counter.names("attention") == (ATTENTION_SPLIT if ON_GPU else ATTENTION_PREFILL) * n_attn
    assert counter.syncs == [] and seen.sites == []


def _meta(*shape):
    return torch.empty(*shape, device="meta", dtype=torch.bfloat16)


@pytest.mark.parametrize("M", [1, 8])
def test_real_0p8b_projections_take_the_fused_paths(M):
    """The 0.8B decode projections (hidden 1024, GDN in_proj 8224, attention qkv 5120, FFN 3584) at B = M take the
    fused GEMVs the tiny model's "triton-fused" count runs through, so its 5 and 7 launches per layer hold there."""
    x, x_gdn, x_attn, x_ffn = _meta(M, 1024), _meta(M, 2048), _meta(M, 2048), _meta(M, 3584)
    assert kernels_module._norm_gemv_wins(x, _meta(8224, 1024))  # GDN in_proj
    assert kernels_module._norm_gemv_wins(x, _meta(5120, 1024))  # attention qkv
    assert kernels_module._gemv_wins(x, _meta(7168, 1024), fused=True)  # gate_up
    for xi in (x_gdn, x_attn, x_ffn):  # out_proj, o_proj, down
        assert kernels_module._residual_gemv_wins(xi, _meta(1024, xi.shape[1]))


def test_9b_projections_stay_on_cublas():
    """The 9B class keeps cuBLAS for its wide projections, where it streams faster than the GEMV at M = 1."""
    x = _meta(1, 4096)
    assert not kernels_module._norm_gemv_wins(x, _meta(12352, 4096))
    assert not kernels_module._norm_gemv_wins(x, _meta(10240, 4096))
    assert not kernels_module._residual_gemv_wins(_meta(1, 12288), _meta(4096, 12288))


def test_counter_sees_torch_ops_and_syncs():
    x = torch.ones(4, device=DEVICE)
    with LaunchCounter() as c:
        y = (x * 2)[1:]  # one kernel, one view
        y.sum().item()  # one kernel, one read back
    assert Counter(n for _, n in c.launches) == Counter({"aten.mul": 1, "aten.sum": 1}) and len(c.syncs) == 1
