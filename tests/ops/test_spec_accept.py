"""spec_accept (Triton) and spec_accept_naive against the host definition ``ninfer.sampling.accept``.

Each row gets its own sampling parameters (greedy, temperature, top-k/top-p, penalties that see the earlier drafts),
seed and absolute position; the processed logits fed to the op are the host's own ``processed_logits`` of each
verified row. Greedy rows get forced drafts (the target's argmax chain, wrong at a chosen position); random rows get
drafts drawn from a nearby draft model or a point mass (``ForcedDrafts``' q), so every acceptance length, rejections
with a residual draw and full acceptance with a bonus all occur. Emitted tokens and counts must equal the host's
exactly; verified rows past a row's drafts and the workspaces are NaN-poisoned, so a read past them shows.
"""

import pytest
import torch

from _device import DEVICE, ON_GPU
from ninfer.fast.ops.sample import layout as SL
from ninfer.fast.ops.spec_accept import SpecAcceptWorkspace, spec_accept, spec_accept_naive
from ninfer.fast.ops.spec_accept import layout as L
from ninfer.sampling import RowContext, SamplingParams, accept, draw_draft, processed_logits
from ninfer.sampling.philox import seed_tensor

# (B, k, V, block): odd vocabularies, ragged last blocks, k = 1, 3, 7; the GPU adds real vocabularies
SHAPES = [(1, 1, 97, 32), (3, 3, 1001, 128), (3, 7, 333, 64), (1, 7, 61, 32)] + \
    ([(8, 3, 248320, 2048), (4, 7, 151936, 1024)] if ON_GPU else [])


def _params(kind: int, gen: torch.Generator) -> SamplingParams:
    if kind == 0:
        return SamplingParams(temperature=0.0)
    t = 0.6 + float(torch.rand(1, generator=gen))
    if kind == 1:
        return SamplingParams(temperature=t)
    if kind == 2:
        return SamplingParams(temperature=t, top_k=20, top_p=0.9, repetition_penalty=1.2)
    return SamplingParams(temperature=0.0, presence_penalty=0.8, frequency_penalty=0.3)  # greedy, penalised


class Row:
    """One batch row: its context, raw target logits [k+1, V], drafts, q and the op's processed inputs."""

    def __init__(self, k: int, V: int, kind: int, gen: torch.Generator, *, point_mass: bool):
        self.params = _params(kind, gen)
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=gen)) * 4 + 3
        prompt = torch.randint(0, V, (5,), generator=gen).tolist()
        outputs = torch.randint(0, V, (3,), generator=gen).tolist()
        self.ctx = RowContext(self.params, seed, prompt, outputs, (V - 1,))
        self.base = int(torch.randint(8, 2 ** 40, (1,), generator=gen))
        self.n = int(torch.randint(0, k + 1, (1,), generator=gen))
        self.target = 2.5 * torch.randn(k + 1, V, generator=gen)  # [k+1, V]
        near = self.target[:k] + 0.7 * torch.randn(k, V, generator=gen)  # a draft model close to the target
        length = int(torch.randint(0, self.n + 1, (1,), generator=gen))  # greedy rows: forced acceptance length
        self.drafts: list[int] = []
        self.q: list[torch.Tensor | None] = []
        self.z = torch.full((k + 1, V), float("nan"))  # rows past n stay NaN: the op must not read them
        self.zq = torch.full((k, V), float("nan"))
        for i in range(k + 1):
            at = self.ctx.at(self.base + i, self.drafts, None)
            if i <= self.n:
                self.z[i] = processed_logits(self.target[i], at)
            if i >= self.n:
                continue
            if self.params.is_greedy:
                top = int(torch.argmax(self.z[i]))
                self.drafts.append(top if i < length else (top + 1 + i) % V)
                self.q.append(None)
            elif point_mass:
                d = int(torch.argmax(self.z[i])) if i < length else int(torch.randint(0, V, (1,), generator=gen))
                self.drafts.append(d)
                self.q.append(torch.nn.functional.one_hot(torch.tensor(d), V).double())
                self.zq[i] = torch.where(self.q[-1] > 0, 0.0, float("-inf"))
            else:
                d, q = draw_draft(near[i], self.ctx, self.base + i, self.drafts)
                self.drafts.append(d)
                self.q.append(q)
                self.zq[i] = processed_logits(near[i], at)

    def host(self) -> tuple[int, ...]:
        return accept(self.target[:self.n + 1], self.drafts, self.q, self.ctx, self.base,
                      [None] * (self.n + 1)).tokens


def _batch(rows: list[Row], k: int):
    B = len(rows)
    iparams = torch.zeros(B, SL.INT_COLUMNS, dtype=torch.int64)
    iparams[:, SL.SEED] = seed_tensor([r.ctx.seed for r in rows])
    iparams[:, SL.POSITION] = torch.tensor([r.base for r in rows])
    iparams[:, SL.FLAGS] = torch.tensor([SL.GREEDY if r.params.is_greedy else 0 for r in rows])
    drafts = torch.full((B, k), 12345, dtype=torch.int64)  # junk past each row's drafts
    for b, r in enumerate(rows):
        drafts[b, :r.n] = torch.tensor(r.drafts, dtype=torch.int64)
    num = torch.tensor([r.n for r in rows], dtype=torch.int32)
    z = torch.stack([r.z for r in rows])
    zq = torch.stack([r.zq for r in rows])
    return tuple(t.to(DEVICE) for t in (z, drafts, num, iparams, zq))


def _expect(out: torch.Tensor, rows: list[Row], k: int, name: str) -> None:
    out = out.cpu()
    for b, r in enumerate(rows):
        want = r.host()
        got = out[b].tolist()
        assert got[L.STATUS] == L.OK, f"{name} row {b}: status {got[L.STATUS]}"
        assert tuple(got[L.TOKENS:L.TOKENS + got[L.COUNT]]) == want, \
            f"{name} row {b} (n={r.n}, {r.params}): {got} != host {want}"
        assert got[L.TOKENS + len(want):] == [L.NO_TOKEN] * (k + 1 - len(want)), f"{name} row {b}: tail {got}"


@pytest.mark.parametrize("B,k,V,block", SHAPES)
def test_spec_accept_equals_the_host(B, k, V, block):
    gen = torch.Generator().manual_seed(1000 * B + 10 * k + V)
    seen = set()
    for trial in range(max(3, 12 // B)):
        rows = [Row(k, V, (b + trial) % 4, gen, point_mass=trial % 3 == 1) for b in range(B)]
        z, drafts, num, iparams, zq = _batch(rows, k)
        out = torch.full((B + 2, L.TOKENS + k + 1), -7, dtype=torch.int32, device=DEVICE)
        ws = SpecAcceptWorkspace.allocate(B + 2, k, V, DEVICE, block_v=block)
        tri = spec_accept(z, drafts, num, iparams, zq, workspace=ws, out=out[:B])
        _expect(spec_accept_naive(z, drafts, num, iparams, zq), rows, k, "naive")
        _expect(tri, rows, k, "triton")
        assert (out[B:] == -7).all(), "rows past B were written"
        seen |= {(r.params.is_greedy, len(r.host()) - 1 == r.n) for r in rows}
    assert len(seen) >= 3, f"cases did not cover greedy/random x full/partial acceptance: {seen}"


def test_spec_accept_all_greedy_without_q():
    """An all-greedy launch takes no draft logits; every acceptance length 0..k occurs."""
    k, V = 3, 211
    gen = torch.Generator().manual_seed(5)
    rows = []
    while len({len(r.host()) for r in rows}) < k + 1 or len(rows) < 6:
        rows.append(Row(k, V, 0, gen, point_mass=False))
    rows = rows[:16]
    z, drafts, num, iparams, _ = _batch(rows, k)
    _expect(spec_accept_naive(z, drafts, num, iparams), rows, k, "naive")
    _expect(spec_accept(z, drafts, num, iparams, workspace=SpecAcceptWorkspace.allocate(len(rows), k, V, DEVICE,
                                                                                        block_v=64)), rows, k, "triton")


def test_spec_accept_statuses():
    """A row that cannot be drawn from fails only where the walk reaches it: NaN at a reached row is BAD_LOGITS, an
    all -inf reached row ALL_MASKED, and a NaN after the first rejection is never looked at."""
    k, V = 3, 100
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(4, k + 1, V, generator=gen)
    top = torch.argmax(z, dim=-1)  # [4, k+1]
    drafts = top[:, :k].clone()
    drafts[2, 0] = (drafts[2, 0] + 1) % V  # row 2 rejects its first draft
    z[0, 2, 7] = float("nan")  # reached (drafts 0 and 1 are the argmax)
    z[1, 1] = float("-inf")  # reached, nothing allowed
    z[2, 1, 3] = float("nan")  # after row 2's rejection: unread
    z[3, 3, 5] = float("inf")  # the bonus row
    iparams = torch.zeros(4, SL.INT_COLUMNS, dtype=torch.int64)
    iparams[:, SL.FLAGS] = SL.GREEDY
    iparams[:, SL.POSITION] = 40
    args = [t.to(DEVICE) for t in (z, drafts, torch.full((4,), k, dtype=torch.int32), iparams)]
    for name, out in (("naive", spec_accept_naive(*args)), ("triton", spec_accept(*args))):
        out = out.cpu()
        assert out[:, L.STATUS].tolist() == [L.BAD_LOGITS, L.ALL_MASKED, L.OK, L.BAD_LOGITS], name
        assert out[2, L.COUNT] == 1 and out[2, L.TOKENS] == top[2, 0], name
        assert ((out >= -1) & (out < V)).all(), f"{name}: a failed row emitted an invalid id"
