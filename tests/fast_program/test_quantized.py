"""The fast Program on quantized artifacts against the reference Program on the same file (which dequantizes each
object by its format's math): FP8 block, int4/int5 groups, NVFP4, a mixed recipe (fused parents of different
kinds become Segments; GDN b/a rows off the fp8 block grid fuse with per-row scales), a fused int4 parent of row
views, quantized MoE experts. Prefill logits within 1e-2 relative RMS (fp32 here, so in practice ~1e-6), greedy
tokens equal through the Engine, and the memory plan counting the bytes really resident. A quantized parameter the
fast kernels cannot run fails at start with its binding, object and format named."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from ninfer.artifact import ArtifactWriter
from ninfer.artifact.build import add_fused, add_packed, add_uses
from ninfer.fast.ops.qlinear import QuantWeight, Segments
from ninfer.fast.program import FastProgram
from ninfer.fast.program.config import GRAPHED_PREFILL_TOKENS
from ninfer.models.qwen3_5.capacity import weight_bytes
from ninfer.models.qwen3_5.params import logical_parameters
from ninfer.reference.program import ReferenceProgram, ReferenceProgramConfig
from ninfer.testing.weights import peaked_text_tensors
from ninfer.testing.numerics import assert_close
from ninfer.testing.quant import pack_planes
from ninfer.testing.serving import serve
from ninfer.testing.sessions import token_request

RECIPES = {
    "fp8": ("fp8_e4m3", "float8_e4m3fn", {"block": [16, 16]}),
    "fp8_row": ("fp8_e4m3", "float8_e4m3fn", {}),
    "int4": ("int_group", "int4", {"group_size": 16}),
    "int5": ("int_group", "int5", {"group_size": 32}),
    "int8_zp": ("int_group", "int8", {"group_size": 16, "zero_point": True, "scale_dtype": "bfloat16"}),
    "int4_act": ("int_group", "int4", {"group_size": 16, "zero_point": True, "act_order": True}),
    "nvfp4": ("nvfp4", "nvfp4", {}),
    "nvfp4_rows": ("nvfp4", "nvfp4", {"global_rows": 1, "input_scale": True}),
}
ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
PROGRAM = dict(max_concurrency=2, max_context=128, page_size=4, kv_pages=80, checkpoint_slots=2,
               dtype=torch.float32)


def _recipe_of(name: str, spec, recipe: str):
    if spec.kind not in ("linear", "experts", "router") or spec.shape[-1] < 16:
        return None
    if recipe == "int4_tiles":
        # down_proj (K = 128) in groups of whole 128-column tiles: loaded in the tiled GEMV's order
        return ("int_group", "int4", {"group_size": 128}) if name.endswith("down_proj.weight") else RECIPES["int4"]
    if recipe == "mixed":
        # z and a in int4, the rest of in_proj fp8 (a Segments projection), MLP down kept dense
        if name.endswith(("in_proj_z.weight", "in_proj_a.weight")):
            return RECIPES["int4"]
        return None if name.endswith("down_proj.weight") else RECIPES["fp8"]
    return RECIPES[recipe]


def write_quantized(path, cfg, weights, recipe: str, fused_qk: bool = False, a8: bool = False):
    specs = logical_parameters(cfg)
    with ArtifactWriter(path) as w:
        fused = {}
        if fused_qk:
            for i in cfg.attention_layers:
                p = f"layers.{i}.self_attn"
                fused[f"{p}.q_proj.weight"] = (f"{p}.qk", [f"{p}.q_proj.weight", f"{p}.k_proj.weight"])
        for name, t in weights.items():
            if name in fused:
                parent, members = fused[name]
                add_fused(w, parent, [(m, weights[m]) for m in members], feature="text", kind="linear",
                          format="int_group", dtype="int4", params={"group_size": 16})
                continue
            if any(name in ms for _, ms in fused.values()):
                continue
            r = _recipe_of(name, specs[name], recipe)
            if r is None:
                w.add_tensor(name, t)
            else:
                # act-order and per-row-group global scales are laid out the way imports store them
                w.add_object(name, format=r[0], dtype=r[1], shape=tuple(t.shape), params=r[2],
                             planes=pack_planes(t.float().numpy(), *r))
            w.bind(name, name, feature=specs[name].feature, kind=specs[name].kind)
        add_uses(w, (lambda site, b: "AllowA8") if a8 else None)
        return w.finish(cfg.to_dict(), {"name": f"tiny-{recipe}"}, {})


def _fast(path, kernels="naive", **config):
    return FastProgram.from_artifact(path, budget_bytes=1 << 30, device=DEVICE,
                                     kernels="triton" if ON_GPU else kernels, **PROGRAM, **config)


def _logits(program, tokens):
    """All prefill logits of one sequence on slot 0 / row 0 with pages 0.. (fast model) or a fresh state."""
    if isinstance(program, FastProgram):
        m = program.model
        m.pools.block_tables[0] = torch.arange(m.plan.max_pages_per_seq, dtype=torch.int32, device=DEVICE)
        return m.prefill(tokens.to(DEVICE), 0, 0, 0, all_logits=True)
    model = program.model
    return model.prefill(tokens, model.new_state())


@pytest.mark.parametrize("recipe,fused_qk", [("fp8", False), ("fp8_row", False), ("int4", True), ("int5", False),
                                              ("int8_zp", False), ("int4_act", False), ("nvfp4", False),
                                              ("nvfp4_rows", False), ("mixed", False)])
def test_quantized_logits_match_reference(tiny, tmp_path, prompt_of, recipe, fused_qk):
    cfg, weights = tiny
    path = write_quantized(tmp_path / f"{recipe}.ninfer", cfg, weights, recipe, fused_qk)
    fast = _fast(path)
    ref = ReferenceProgram.from_artifact(path, ReferenceProgramConfig(**{**PROGRAM, "dtype": torch.float32}))
    tokens = torch.tensor(prompt_of(21, seed=5))
    assert_close(f"{recipe} logits", _logits(ref, tokens), _logits(fast, tokens), 1e-2)
    # the plan holds the resident bytes: less than the same model dense at the plan's dtype
    assert fast.model.plan.weight_bytes == fast.model.weights.nbytes < weight_bytes(cfg, "float32")
    kinds = {type(fast.model.weights.layers[0].mixer.in_proj)}
    # act-order parts keep their own column orders: no fused kernel call
    assert kinds == ({Segments} if recipe in ("mixed", "int4_act") else {QuantWeight})


def test_quantized_greedy_through_the_engine(tiny, tmp_path, prompt_of):
    cfg, weights = tiny
    path = write_quantized(tmp_path / "int4.ninfer", cfg, weights, "int4")
    prompts = [prompt_of(n, seed=n) for n in (3, 30)]
    reqs = lambda: [token_request(p, 6) for p in prompts]  # noqa: E731
    ref = ReferenceProgram.from_artifact(path, ReferenceProgramConfig(**{**PROGRAM, "dtype": torch.float32}))
    got = serve(_fast(path), reqs(), max_concurrency=2, prefill_chunk=11)
    want = serve(ref, reqs(), max_concurrency=2, prefill_chunk=11)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]


def test_triton_kernels_on_a_quantized_artifact(tiny, tmp_path, prompt_of):
    """The Triton path (interpreted here): quantized GEMV in decode, dequantize-then-GEMM in prefill."""
    cfg, weights = tiny
    path = write_quantized(tmp_path / "fp8.ninfer", cfg, weights, "mixed")
    prompts = [prompt_of(9, seed=3)]
    ref = ReferenceProgram.from_artifact(path, ReferenceProgramConfig(**{**PROGRAM, "dtype": torch.float32}))
    got = serve(_fast(path, kernels="triton"), [token_request(p, 3) for p in prompts], max_concurrency=1)
    want = serve(ref, [token_request(p, 3) for p in prompts], max_concurrency=1)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]


def test_tiled_int4_through_the_triton_kernels(tiny, tmp_path, prompt_of):
    """int4 re-laid out at load into the tile order (docs/quantization.md "Loading"; down_proj's K = 128 holds whole
    tiles): the reference's logits in prefill, its greedy tokens through the Engine on the Triton kernels
    (interpreted here)."""
    cfg = dataclasses.replace(tiny[0], intermediate_size=max(128, tiny[0].intermediate_size))
    path = write_quantized(tmp_path / "int4_tiles.ninfer", cfg, peaked_text_tensors(cfg), "int4_tiles")
    ref = ReferenceProgram.from_artifact(path, ReferenceProgramConfig(**{**PROGRAM, "dtype": torch.float32}))
    fast = _fast(path, kernels="triton")
    down = fast.model.weights.layers[0].ffn.down
    assert down.tiled and not fast.model.weights.layers[0].ffn.gate_up.tiled  # g = 16 keeps the stored order
    tokens = torch.tensor(prompt_of(21, seed=5))
    assert_close("int4 tiles logits", _logits(ref, tokens), _logits(fast, tokens), 1e-2)
    assert fast.model.plan.weight_bytes == fast.model.weights.nbytes
    prompts = [prompt_of(9, seed=3)]
    got = serve(_fast(path, kernels="triton"), [token_request(p, 3) for p in prompts], max_concurrency=1)
    want = serve(ref, [token_request(p, 3) for p in prompts], max_concurrency=1)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]


def test_quantized_embedding_is_refused_at_start(tiny, tmp_path):
    cfg, weights = tiny
    specs = logical_parameters(cfg)
    with ArtifactWriter(tmp_path / "emb.ninfer") as w:
        for name, t in weights.items():
            if name == "embed_tokens.weight":
                add_packed(w, name, t, format="fp8_e4m3", dtype="float8_e4m3fn", params={"block": [16, 16]})
            else:
                w.add_tensor(name, t)
            w.bind(name, name, feature=specs[name].feature, kind=specs[name].kind)
        path = w.finish(cfg.to_dict(), {"name": "emb"}, {})
    with pytest.raises(NotImplementedError, match="embedding parameters: binding 'embed_tokens.weight' .*fp8_e4m3"):
        _fast(path)


def test_untileable_group_is_refused_at_start(tiny, tmp_path):
    cfg, weights = tiny
    specs = logical_parameters(cfg)
    target = "layers.0.mlp.down_proj.weight"  # K = 64: group 8 divides it, but a tile needs 16 columns
    with ArtifactWriter(tmp_path / "g8.ninfer") as w:
        for name, t in weights.items():
            if name == target:
                add_packed(w, name, t, format="int_group", dtype="int4", params={"group_size": 8})
            else:
                w.add_tensor(name, t)
            w.bind(name, name, feature=specs[name].feature, kind=specs[name].kind)
        path = w.finish(cfg.to_dict(), {"name": "g8"}, {})
    with pytest.raises(NotImplementedError, match=f"int_group kernels cannot run binding '{target}'.*group size 8"):
        _fast(path)


def _moe_config():
    from ninfer.models.qwen3_5.config import FULL, LINEAR, Qwen35Config
    return Qwen35Config.from_hf(dict(
        model_type="qwen3_5_moe_text", vocab_size=97, hidden_size=32, num_hidden_layers=2, layer_types=[LINEAR, FULL],
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16, rms_norm_eps=1e-6,
        max_position_embeddings=4096, tie_word_embeddings=False, mtp_num_hidden_layers=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True}))


@pytest.mark.parametrize("recipe", ["fp8", "int4", "int4_act", "nvfp4"])
def test_quantized_moe_experts(tmp_path, prompt_of, recipe):
    """Routed experts stored quantized ([E, 2I, H] and [E, H, I] objects): naive kernels in prefill and decode, and
    the Triton path (pair-mode GEMV in decode, dequantized stacks in prefill) through the Engine."""
    from ninfer.testing.weights import peaked_text_tensors
    cfg = _moe_config()
    path = write_quantized(tmp_path / f"moe-{recipe}.ninfer", cfg, peaked_text_tensors(cfg), recipe)
    fast = _fast(path)
    assert isinstance(fast.model.weights.layers[0].ffn.experts_down, QuantWeight)
    ref = ReferenceProgram.from_artifact(path, ReferenceProgramConfig(**{**PROGRAM, "dtype": torch.float32}))
    tokens = torch.tensor(prompt_of(13, seed=8)) % cfg.vocab_size
    assert_close(f"moe {recipe} logits", _logits(ref, tokens), _logits(fast, tokens), 1e-2)
    if recipe == "int4":
        reqs = lambda: [token_request(tokens.tolist()[:7], 3)]  # noqa: E731
        want = serve(ref, reqs(), max_concurrency=1)
        assert [r.token_ids for r in serve(_fast(path, "triton"), reqs(), max_concurrency=1)] == \
            [r.token_ids for r in want]


def test_fp8_experts_through_moe_decode(tmp_path, prompt_of, monkeypatch):
    """With ``kernels.FP8_MOE_DECODE`` (the default) a one-row decode step runs FP8 expert stacks, the shared
    expert's too, through the fused ``moe_decode`` as stored: greedy tokens equal the reference's."""
    from ninfer.fast.model import kernels
    from ninfer.fast.ops import moe_decode
    from ninfer.testing.weights import peaked_text_tensors
    cfg = _moe_config()
    path = write_quantized(tmp_path / "moe-fp8.ninfer", cfg, peaked_text_tensors(cfg), "fp8")
    fused, stacks = moe_decode.moe_decode, []
    monkeypatch.setattr(moe_decode, "moe_decode", lambda *a, **kw: stacks.append(a[2:4]) or fused(*a, **kw))
    assert kernels.FP8_MOE_DECODE
    ref = ReferenceProgram.from_artifact(path, ReferenceProgramConfig(**{**PROGRAM, "dtype": torch.float32}))
    prompt = (torch.tensor(prompt_of(13, seed=8)) % cfg.vocab_size).tolist()[:7]
    want = serve(ref, [token_request(prompt, 4)], max_concurrency=1)
    got = serve(_fast(path, "triton"), [token_request(prompt, 4)], max_concurrency=1)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert stacks and all(isinstance(w, QuantWeight) for pair in stacks for w in pair)


def test_a8_prefill_runs_fp8_activations(tiny, tmp_path, prompt_of):
    """AllowA8 on every Use of an FP8 [32, 32]-block artifact: prefill quantizes activations to e4m3, which moves
    this tiny peaked model's logits by ~20% (32-term dot products average little of e4m3's 2^-4 rounding away;
    test_fp8_gemm bounds the op itself): near the A16 logits and their top-1, never equal to them."""
    cfg, weights = tiny
    params = {"block": [32, 32]}
    RECIPES["fp8_32"] = ("fp8_e4m3", "float8_e4m3fn", params)
    try:
        # the graphs asked for (on the CPU they are off by default)
        graphs = dict(prefill_graph_tokens=GRAPHED_PREFILL_TOKENS)
        a8 = _fast(write_quantized(tmp_path / "a8.ninfer", cfg, weights, "fp8_32", a8=True), **graphs)
        a16 = _fast(write_quantized(tmp_path / "a16.ninfer", cfg, weights, "fp8_32"), **graphs)
    finally:
        del RECIPES["fp8_32"]
    assert a8.model.weights.layers[1].mixer.o_proj.a8 and not a16.model.weights.layers[1].mixer.o_proj.a8
    # padding a short piece to a graph bucket would switch it to the A8 GEMM: A8 weights keep every piece eager
    assert a8.pieces is None and a8.model.plan.prefill_graph_tokens == 0 and a16.pieces is not None
    tokens = torch.tensor(prompt_of(21, seed=5))
    la8, la16 = _logits(a8, tokens), _logits(a16, tokens)
    assert not torch.equal(la8, la16)
    assert_close("A8 prefill vs A16", la16, la8, 0.35)
    assert (la8.argmax(-1) == la16.argmax(-1)).float().mean() >= 0.7


def test_ready_line_names_the_weight_format(tiny, tmp_path):
    from ninfer.artifact import open_artifact
    from ninfer.model_facts import ArtifactFacts, weight_format
    cfg, weights = tiny
    path = write_quantized(tmp_path / "int4.ninfer", cfg, weights, "int4")
    with open_artifact(path) as art:
        assert weight_format(art) == "float32 + int4 g16"  # the tiny model's embedding and lm_head outweigh it
        assert ArtifactFacts.read(art).weights.endswith("; float32 + int4 g16")
