"""The GDN decode recurrence over the verify pass's blocks, step by step through the state slots: block b's token
rows ``cu[b] .. cu[b+1]-1`` are its steps j = 0.., step 0 reading ``slot_ids[b]`` and step j writing the stepped
window and S into ``out_slots[j, b]``, which step j + 1 reads: exactly ``gdn_decode_naive`` called once per step on
the blocks still that long (the fast Program's per-step path)."""

from __future__ import annotations

import torch

from ninfer.fast.ops.gdn_decode.naive import gdn_decode_naive


def gdn_verify_naive(mixed: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     conv_state: torch.Tensor, conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                     norm_weight: torch.Tensor, ssm_state: torch.Tensor, slot_ids: torch.Tensor, cu: torch.Tensor,
                     out_slots: torch.Tensor, num_k_heads: int, head_k_dim: int, head_v_dim: int, eps: float = 1e-6,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """mixed [N, conv_dim], z [N, HV*dv], a/b [N, HV]: the blocks' token rows packed (block b at rows cu[b] ..
    cu[b+1]-1, ``cu`` [B+1]); ``slot_ids`` [B] each block's state slot (negative: a zero state); ``out_slots``
    [W, >= B] where step j of block b leaves its state (negative: nowhere; every step but a block's last must
    leave it somewhere, the next step reads it there, except in a padding block, whose rows of y are unspecified).
    Returns ``out`` [N, HV*dv] (allocated zero when None) with every block row's y; rows of no block keep their
    values."""
    bounds = cu.tolist()
    B = len(bounds) - 1
    lens = [bounds[i + 1] - bounds[i] for i in range(B)]
    out = mixed.new_zeros(mixed.shape[0], a.shape[1] * head_v_dim) if out is None else out
    reads = slot_ids[:B].clone()
    for j in range(max(lens, default=0)):
        live = [i for i in range(B) if lens[i] > j]
        at = torch.tensor(live, device=slot_ids.device)
        rows = torch.tensor([bounds[i] + j for i in live], device=mixed.device)
        writes = out_slots[j, :B].index_select(0, at).to(slot_ids.dtype)
        gdn_decode_naive(mixed, z, a, b, conv_state, conv_weight, A_log, dt_bias, norm_weight, ssm_state,
                         reads.index_select(0, at), num_k_heads, head_k_dim, head_v_dim, eps, out_slot_ids=writes,
                         rows=rows, out=out)
        reads[at] = writes
    return out
