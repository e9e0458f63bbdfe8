"""The device MTP head (ninfer.fast.model.mtp) against the reference model's `mtp_forward` on the same weights:
two sequences at scrambled slots, rows and pages; after the prompt (advance from position 0) the stored hidden,
chained drafts of different lengths per row (draft logits compared at every step), then one verified block per row
(the multi-query target pass, advance from the frontier) and the drafts after it. Pairs live at page position
p + 1 and drafting writes no page, so the pages outside the sequences' written positions stay as they were."""

import pytest
import torch

from _fast_env import DEVICE, ON_GPU
from _fast_setup import build_pair, place_sequences, tiny_config
from ninfer.reference.state import SequenceState
from ninfer.testing.numerics import assert_close

FP32_TOL = 1e-2 if ON_GPU else 1e-4
CASES = [pytest.param(torch.float32, "triton", FP32_TOL, id="fp32-triton"),
         pytest.param(torch.bfloat16, "triton" if ON_GPU else "naive", 3e-2, id="bf16")]


def _ref_drafts(ref, st, hidden, pending, k):
    """The reference chain on a private copy of the MTP KV: draft logits [k, V] (greedy drafts)."""
    view = SequenceState(gdn={}, kv={}, mtp_kv=[c.clone() for c in st.mtp_kv])
    h, x, out = hidden, pending, []
    for j in range(k):
        logits, h_out = ref.mtp_forward(h[None], torch.tensor([x]), view, step=j, return_hidden=True)
        out.append(logits[0])
        h, x = h_out[0], int(torch.argmax(logits[0]))
    return torch.stack(out)


def _fast_drafts(fast, slots, rows, frontiers, pending, ks):
    """Greedy drafts drawn on the device; every row drafts max(ks) steps (its own ks[i] are the ones it keeps)."""
    got: dict[tuple[int, int], torch.Tensor] = {}

    def draw(j, live, logits):
        for n, i in enumerate(live.tolist()):
            got[i, j] = logits[n].clone()
        return torch.argmax(logits, dim=-1)
    fast.mtp.draft(slots, rows, frontiers, pending, ks, draw)
    drafts = [[int(torch.argmax(got[i, j])) for j in range(k)] for i, k in enumerate(ks)]
    return drafts, [torch.stack([got[i, j] for j in range(k)]) for i, k in enumerate(ks)]


@pytest.mark.parametrize("dtype,kernels,tol", CASES)
def test_mtp_head_follows_the_reference(dtype, kernels, tol):
    pair = build_pair(tiny_config(mtp=1), dtype, kernels)
    fast, ref, V = pair.fast, pair.ref, pair.cfg.vocab_size
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, V, (n,), generator=gen) for n in (6, 11)]
    slots, rows = place_sequences(fast, 2)
    states, last = [], []
    for slot, row, tokens in zip(slots, rows, prompts):
        _, hidden = fast.prefill(tokens.to(DEVICE), slot, row, 0, return_hidden=True)
        fast.mtp.advance([slot], [row], [0], tokens.to(DEVICE), [hidden])
        st = ref.new_state()
        _, h = ref.prefill(tokens, st, return_hidden=True)
        ref.mtp_forward(h[:-1], tokens[1:], st)
        states.append(st)
        last.append(h[-1])
        assert_close("stored hidden", h[-1], fast.pools.mtp_hidden[slot], tol)
    k_pages = fast.pools.k[fast.mtp.pool].clone()
    frontiers = [len(p) for p in prompts]
    pending = torch.randint(0, V, (2,), generator=gen).tolist()
    drafts, logits = _fast_drafts(fast, slots, rows, frontiers, pending, [3, 2])
    assert torch.equal(fast.pools.k[fast.mtp.pool], k_pages)  # drafting writes no page
    for i, k in enumerate((3, 2)):
        want = _ref_drafts(ref, states[i], last[i], pending[i], k)
        assert_close(f"row {i} draft logits", want, logits[i], tol)
    # one verified block per row, [pending, drafts], then the drafts from the new frontier
    blocks = [[p] + d for p, d in zip(pending, drafts)]
    packed = torch.tensor([t for b in blocks for t in b], device=DEVICE)
    _, hidden = fast.verify(packed, slots, rows, frontiers, [len(b) for b in blocks])
    fast.mtp.advance(slots, rows, frontiers, packed, list(torch.split(hidden, [len(b) for b in blocks])))
    for i, block in enumerate(blocks):
        _, h = ref.prefill(torch.tensor(block), states[i], chunked=False, return_hidden=True)
        ref.mtp_forward(torch.cat([last[i][None], h[:-1]]), torch.tensor(block), states[i])
        last[i] = h[-1]
    frontiers = [f + len(b) for f, b in zip(frontiers, blocks)]
    pending = torch.randint(0, V, (2,), generator=gen).tolist()
    _, logits = _fast_drafts(fast, slots, rows, frontiers, pending, [2, 3])
    for i, k in enumerate((2, 3)):
        assert_close(f"row {i} draft logits after verify", _ref_drafts(ref, states[i], last[i], pending[i], k),
                     logits[i], tol)
