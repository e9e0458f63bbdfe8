"""`PrefixMasks`: a speculative round's grammar rows filled from drafts that stay on the device, by a host function
queued in stream order (`ninfer/fast/host_function.py`). On CPU the function runs when queued; with
NINFER_TEST_DEVICE=cuda the bracket (D2H drafts, fill, H2D words) runs on a side stream, queued alone or forked and
joined inside a captured pass (the verify graphs' masked twins), and the same checks hold: each fill sees its own
row's drafts of this round, the words land where acceptance reads them, a failing fill fails its row alone, and the
function's own fault is raised at the check."""

from __future__ import annotations

import os

import pytest
import torch

from ninfer.contracts import EngineFailure, RowFailure
from ninfer.fast.capture import warm_and_capture
from ninfer.fast.host_function import HostFunction
from ninfer.fast.ops.sample import layout as L
from ninfer.fast.sampling.prefix_masks import PrefixMasks, RowSource

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
V, K = 75, 4  # 3 words a row, the last one partly past the vocabulary


def _sync() -> None:
    if ON_GPU:
        torch.cuda.synchronize()


def _bits(gen: torch.Generator, n: int) -> torch.Tensor:
    return torch.rand(n, V, generator=gen) < 0.5  # bool [n, V]


def _captured_pass(masks: PrefixMasks, B: int):
    """A stand-in verify pass over B rows with the bracket beside it (fork before, a kernel, join after): a CUDA
    graph replayed every round on CUDA, the eager body elsewhere. Returns its run."""
    x = torch.zeros(64, device=DEVICE)

    def body():
        masks.fork(B)
        x.mul_(2.0)
        masks.join()
    if not ON_GPU:
        return body
    graph, _ = warm_and_capture(body, torch.cuda.Stream(), None, 1)
    masks.function.take_error()  # the warm run filled no row
    return graph.replay


@pytest.mark.parametrize("in_pass", [False, True], ids=["queued", "in-pass"])
def test_each_fill_sees_its_rows_drafts_and_its_words_land_in_place(in_pass):
    """Three rounds through the same buffers (with `in_pass`, a captured pass replayed with new drafts each time):
    a row of host rows (bool, one position unconstrained), a fill row, a row whose fill fails, and an unconstrained
    row."""
    masks = PrefixMasks(4, K, V, DEVICE)
    run_pass = _captured_pass(masks, 4) if in_pass else None
    gen = torch.Generator().manual_seed(3)
    for round_ in range(3):
        drafts = torch.randint(0, V, (4, K), generator=gen)
        lens = [2, K, 3, 0]
        seen, filled = [], _bits(gen, K + 1)

        def fill(got):
            seen.append(list(got))
            return filled[:len(got) + 1]

        def breaks(got):
            raise RuntimeError("planted: the session's grammar failed")
        host_rows = list(_bits(gen, 3))
        host_rows[1] = None
        sources = [RowSource(lens[0], rows=tuple(host_rows)), RowSource(lens[1], fill=fill),
                   RowSource(lens[2], fill=breaks), RowSource(lens[3])]
        queued = masks.queue(drafts.to(DEVICE), sources, in_pass)
        assert seen == [] or not in_pass  # staged: the pass runs the fill
        if in_pass:
            run_pass()
        queued.ready()
        words = queued.words.clone()
        _sync()
        masks.check()
        assert seen == [drafts[1, :lens[1]].tolist()], round_
        assert queued.failures == [None, None, RowFailure.INVALID_SAMPLING_INPUT, None]
        K1 = K + 1
        expected = torch.full((4 * K1, L.bitmask_words(V)), -1, dtype=torch.int32)
        expected[0], expected[2] = L.pack_bits(host_rows[0]), L.pack_bits(host_rows[2])
        expected[K1:2 * K1] = L.pack_bits(filled)
        assert torch.equal(words.cpu(), expected), round_


def test_a_fault_of_the_function_itself_is_raised_at_the_check():
    """More host rows than the block has positions: the function's own fault (not a session's), kept for the host."""
    masks = PrefixMasks(2, K, V, DEVICE)
    rows = (torch.zeros(L.bitmask_words(V), dtype=torch.int32),) * (K + 2)
    masks.queue(None, [RowSource(K, rows=rows)]).ready()
    _sync()
    with pytest.raises(EngineFailure, match="prefix-mask host function"):
        masks.check()
    masks.check()  # taken: the next round starts clean


@pytest.mark.skipif(not ON_GPU, reason="a host node needs a CUDA stream (on CPU `queue(None)` runs the call)")
def test_a_captured_host_node_runs_in_stream_order_on_every_replay():
    """A kernel writes x, the host node reads it from pinned memory and writes y, a copy brings y back: replayed
    with new inputs, every replay's y follows that replay's x."""
    x = torch.zeros(8, device=DEVICE)
    host_x = torch.zeros(8, pin_memory=True)
    host_y = torch.zeros(8, pin_memory=True)
    y = torch.zeros(8, device=DEVICE)
    seed = torch.zeros(8, device=DEVICE)
    fn = HostFunction(lambda: host_y.numpy().__setitem__(slice(None), host_x.numpy() * 2 + 1))

    def body():
        torch.mul(seed, 3.0, out=x)
        host_x.copy_(x, non_blocking=True)
        fn.queue(torch.cuda.current_stream())
        y.copy_(host_y, non_blocking=True)
    graph, _ = warm_and_capture(body, torch.cuda.Stream(), None, 1)
    for i in range(4):
        seed.copy_(torch.arange(8, dtype=torch.float32, device=DEVICE) + i)
        graph.replay()
        got = y.cpu()  # waits for the replay
        assert torch.equal(got, (torch.arange(8, dtype=torch.float32) + i) * 6 + 1), i
    assert fn.take_error() is None
