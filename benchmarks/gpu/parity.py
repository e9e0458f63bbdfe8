"""Real-shape parity, run inside the GPU benchmark: the fast model (bf16 weights and activations, Triton kernels,
decode through a captured CUDA graph) against the reference model (fp32, on the host CPU) on the same random
weights. One prompt is prefilled, then a few tokens are decoded one by one; the relative RMS error of every logits
row is reported (the tests' bf16 bound is 2e-2) together with top-1 agreement."""

from __future__ import annotations

import torch

from ninfer.fast.graph_runner import DecodeGraphRunner
from ninfer.fast.model import FastModel
from ninfer.models.qwen3_5.params import TEXT, logical_parameters


def _rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    r, o = ref.double().cpu(), out.double().cpu()
    return float((o - r).pow(2).mean().sqrt() / r.pow(2).mean().sqrt())


def parity(model: FastModel, source, prompt_len: int = 24, steps: int = 3, slot: int = 0, row: int = 0) -> dict:
    """``source`` must be the one the model was built from. Uses (and overwrites) GDN slot ``slot`` and the pages
    of block-table row ``row``."""
    from ninfer.reference import ReferenceModel  # only here: the benchmark, not ninfer.fast, owns the comparison

    cfg, dev = model.cfg, model.device
    names = [n for n in logical_parameters(cfg, (TEXT,)) if not (n == "lm_head.weight" and cfg.tie_word_embeddings)]
    ref = ReferenceModel(cfg, {n: source(n).float().cpu() for n in names}, torch.float32)
    tokens = torch.randint(0, cfg.vocab_size, (prompt_len + steps,), generator=torch.Generator().manual_seed(5))
    state = ref.new_state()
    refs = [ref.prefill(tokens[:prompt_len], state)[-1]]
    outs = [model.prefill(tokens[:prompt_len].to(dev), slot, row, 0)]
    runner = DecodeGraphRunner(model, max_batch=1)
    runner.capture([1])
    i32 = dict(dtype=torch.int32, device=dev)
    for t in range(prompt_len, prompt_len + steps):
        refs.append(ref.decode_step(int(tokens[t]), state))
        out = runner.run(tokens[t:t + 1].to(dev), torch.tensor([slot], **i32), torch.tensor([row], **i32),
                         torch.tensor([t + 1], **i32), torch.tensor([t], **i32))[0]
        outs.append(out[0].clone())
    runner.reset()
    return {"prompt_len": prompt_len, "steps": steps, "graphs": runner.use_graphs,
            "rel_rms": [_rel_rms(r, o) for r, o in zip(refs, outs)],
            "top1_agree": [int(r.argmax()) == int(o.argmax()) for r, o in zip(refs, outs)]}
