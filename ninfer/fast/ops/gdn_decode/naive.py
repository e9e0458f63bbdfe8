"""One GDN decode step for a batch of sequences, each reading its state slot and writing the stepped state into its
out slot (the same one by default; the verify pass keeps the state after every block position apart,
docs/speculative.md), in plain fp32 torch.

Per sequence (qwen35-architecture.md sections 2.4 and 8): conv window update + SiLU, split q/k/v, l2-normalise q/k
(q scaled by dk^-0.5), gates beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), the delta-rule write into
S, o = S^T q, then the gated RMSNorm ``w * rmsnorm(o) * silu(z)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_decode_naive(mixed: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     conv_state: torch.Tensor, conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                     norm_weight: torch.Tensor, ssm_state: torch.Tensor, slot_ids: torch.Tensor, num_k_heads: int,
                     head_k_dim: int, head_v_dim: int, eps: float = 1e-6,
                     out_slot_ids: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """mixed [B, conv_dim] (in_proj_qkv output), z [B, HV*dv], a/b [B, HV]; conv_state [slots, conv_dim, K-1] and
    ssm_state [slots, HV, dk, dv] (fp32) are read at ``slot_ids`` [B] (a negative id reads zeros) and the stepped
    window and S written at ``out_slot_ids`` [B] (None: ``slot_ids``, in place; a negative id writes nothing; no
    out slot may be another row's read slot). Returns y [B, HV*dv] in mixed's dtype. With ``rows`` [B] (and
    ``out`` [N, HV*dv]) sequence i's inputs are row rows[i] of mixed/z/a/b [N, ...] and its y goes to row rows[i]
    of ``out``, which is returned (the other rows untouched)."""
    if rows is not None:
        at = rows.long()
        out[at] = gdn_decode_naive(mixed[at], z[at], a[at], b[at], conv_state, conv_weight, A_log, dt_bias,
                                   norm_weight, ssm_state, slot_ids, num_k_heads, head_k_dim, head_v_dim, eps,
                                   out_slot_ids)
        return out
    B, C = mixed.shape
    HK, dk, dv = num_k_heads, head_k_dim, head_v_dim
    HV = a.shape[1]
    K = conv_weight.shape[-1]
    w = conv_weight.reshape(C, K).float()
    outs = slot_ids if out_slot_ids is None else out_slot_ids
    ys = []
    for i in range(B):
        slot, kept = int(slot_ids[i]), int(outs[i])
        window = conv_state[slot].float() if slot >= 0 else mixed.new_zeros(C, K - 1, dtype=torch.float32)
        full = torch.cat([window, mixed[i].float()[:, None]], dim=1)  # [C, K]
        mc = F.silu((full * w).sum(-1)).to(mixed.dtype).float()  # the conv output is stored in the io dtype
        q, k, v = torch.split(mc, [HK * dk, HK * dk, HV * dv])
        q = q.view(HK, dk)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk ** -0.5
        k = k.view(HK, dk)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        # value head j reads key head j // (HV / HK)
        q, k = q.repeat_interleave(HV // HK, 0), k.repeat_interleave(HV // HK, 0)  # [HV, dk]
        beta = torch.sigmoid(b[i].float())
        g = -A_log.float().exp() * F.softplus(a[i].float() + dt_bias.float())
        S = ssm_state[slot].float() if slot >= 0 else mixed.new_zeros(HV, dk, dv, dtype=torch.float32)
        S = S * g.exp()[:, None, None]
        u = beta[:, None] * (v.view(HV, dv) - torch.einsum("hkv,hk->hv", S, k))
        S = S + k[:, :, None] * u[:, None, :]
        o = torch.einsum("hkv,hk->hv", S, q)  # [HV, dv]
        if kept >= 0:
            conv_state[kept] = full[:, 1:].to(conv_state.dtype)
            ssm_state[kept] = S.to(ssm_state.dtype)
        on = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
        ys.append((on * F.silu(z[i].float().view(HV, dv))).reshape(-1))
    return torch.stack(ys).to(mixed.dtype)
