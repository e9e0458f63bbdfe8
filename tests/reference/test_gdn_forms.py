"""The two forms of the gated delta rule, the conv window and the gates, checked against each other in fp64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ninfer.reference.gdn import CHUNK, causal_conv, chunked_delta_rule, gates, l2norm, recurrent_delta_rule


def _inputs(T: int, HV: int = 3, dk: int = 8, dv: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    q = l2norm(r(T, HV, dk)) * dk ** -0.5
    k = l2norm(r(T, HV, dk))
    v = r(T, HV, dv)
    a, b = r(T, HV), r(T, HV)
    A_log = torch.empty(HV, dtype=torch.float64).uniform_(0.0, 2.5, generator=g)
    logdecay, beta = gates(a, b, A_log, r(HV))
    S0 = r(HV, dk, dv)
    return q, k, v, logdecay, beta, S0


@pytest.mark.parametrize("T", [1, 5, 63, 64, 65, 150])
def test_chunked_equals_recurrent(T):
    q, k, v, g, beta, S0 = _inputs(T)
    o_r, S_r = recurrent_delta_rule(q, k, v, g, beta, S0)
    o_c, S_c, _ = chunked_delta_rule(q, k, v, g, beta, S0)
    assert (o_c - o_r).abs().max() < 1e-12
    assert (S_c - S_r).abs().max() < 1e-12


def test_chunk_boundary_states_equal_step_states():
    T = 150
    q, k, v, g, beta, S0 = _inputs(T, seed=1)
    _, _, bounds = chunked_delta_rule(q, k, v, g, beta, S0)
    assert len(bounds) == 2  # after positions 64 and 128; the end state is the final state, not a boundary
    for n, end in enumerate(range(CHUNK, T, CHUNK)):
        _, S_step = recurrent_delta_rule(q[:end], k[:end], v[:end], g[:end], beta[:end], S0)
        assert (bounds[n] - S_step).abs().max() < 1e-12


def test_recurrence_matches_closed_form_step():
    # S_t = alpha (I - beta k k^T) S_{t-1} + beta k v^T, o_t = S_t^T q: the spec's equivalent one-step form.
    q, k, v, g, beta, S0 = _inputs(1, HV=2, seed=2)
    o, S = recurrent_delta_rule(q, k, v, g, beta, S0)
    for h in range(2):
        kk = k[0, h][:, None]
        expect = g[0, h].exp() * (torch.eye(8, dtype=torch.float64) - beta[0, h] * kk @ kk.T) @ S0[h] \
            + beta[0, h] * kk @ v[0, h][None, :]
        assert torch.allclose(S[h], expect, atol=1e-13)
        assert torch.allclose(o[0, h], expect.T @ q[0, h], atol=1e-13)


def test_causal_conv_continues_from_window():
    g = torch.Generator().manual_seed(3)
    C, K, T = 6, 4, 11
    m = torch.randn(T, C, generator=g, dtype=torch.float64)
    w = torch.randn(C, 1, K, generator=g, dtype=torch.float64)
    whole = F.silu(F.conv1d(m.T[None], w, padding=K - 1, groups=C)[0, :, :T]).T  # torch's causal conv
    out, full = causal_conv(m, torch.zeros(C, K - 1, dtype=torch.float64), w)
    assert torch.allclose(out, whole, atol=1e-14)
    split = 5
    first, full1 = causal_conv(m[:split], torch.zeros(C, K - 1, dtype=torch.float64), w)
    second, _ = causal_conv(m[split:], full1[:, -(K - 1):], w)
    assert torch.allclose(torch.cat([first, second]), whole, atol=1e-14)
    # The window before token t of a call is full[:, t : t+K-1]: the K-1 previous pre-conv inputs.
    assert torch.equal(full[:, 7:7 + K - 1], m[4:7].T)


def test_gates_range_and_formula():
    a = torch.tensor([[-30.0, 0.0, 30.0]], dtype=torch.float64)
    b = torch.tensor([[-5.0, 0.0, 5.0]], dtype=torch.float64)
    A_log = torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64)
    dt_bias = torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)
    g, beta = gates(a, b, A_log, dt_bias)
    assert torch.allclose(beta, torch.sigmoid(b))
    assert torch.allclose(g, -A_log.exp() * F.softplus(a + dt_bias))
    assert bool((g < 0).all()) and bool(((beta > 0) & (beta < 1)).all())
    g32, _ = gates(a.float(), b.float(), A_log.float(), dt_bias.float())
    assert g32.dtype == torch.float32
