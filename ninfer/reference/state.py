"""Explicit, portable per-sequence state of the reference model: a checkpoint at the current frontier.

After consuming tokens ``0..t-1`` a sequence is fully described by: per GDN layer the conv window (the last K-1
pre-conv inputs) and the recurrent state S; per attention layer the post-norm, post-RoPE keys and the values of
positions ``< t``; ``next_position = t``; and, for MTP drafting, the MTP layers' own KV and the last hidden state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ninfer.models.qwen3_5.config import Qwen35Config


@dataclass
class GDNState:
    conv: torch.Tensor  # [conv_dim, K-1] last K-1 pre-conv inputs, oldest first
    recurrent: torch.Tensor  # [HV, dk, dv]

    def clone(self) -> "GDNState":
        return GDNState(self.conv.clone(), self.recurrent.clone())


@dataclass
class KVCache:
    k: torch.Tensor  # [nkv, t, d] post-norm, post-RoPE
    v: torch.Tensor  # [nkv, t, d]

    @property
    def length(self) -> int:
        return self.k.shape[1]

    def clone(self) -> "KVCache":
        return KVCache(self.k.clone(), self.v.clone())

    def truncated(self, t: int) -> "KVCache":
        """A copy holding only positions ``< t``."""
        return KVCache(self.k[:, :t].clone(), self.v[:, :t].clone())

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append new positions; k, v [nkv, T, d]."""
        self.k = torch.cat([self.k, k], dim=1)
        self.v = torch.cat([self.v, v], dim=1)


@dataclass
class SequenceState:
    gdn: dict[int, GDNState]  # keyed by main-decoder layer index
    kv: dict[int, KVCache]  # keyed by main-decoder layer index
    next_position: int = 0
    mtp_kv: list[KVCache] = field(default_factory=list)  # one per MTP layer
    last_hidden: torch.Tensor | None = None  # [H] final-normed hidden of position next_position-1

    @classmethod
    def empty(cls, cfg: Qwen35Config, dtype: torch.dtype = torch.float32) -> "SequenceState":
        """The state before any token: zero conv windows and S, empty KV. ``dtype`` is the activation dtype; S is
        kept in fp32 whatever it is (fp64 in the fp64 mode), like every production kernel does."""
        K = cfg.linear_conv_kernel_dim
        HV, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        s_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        gdn = {i: GDNState(torch.zeros(cfg.conv_dim, K - 1, dtype=dtype), torch.zeros(HV, dk, dv, dtype=s_dtype))
               for i in cfg.linear_layers}
        kv = {i: _empty_kv(cfg, dtype) for i in cfg.attention_layers}
        mtp_kv = [_empty_kv(cfg, dtype) for _ in range(cfg.mtp_num_hidden_layers)]
        return cls(gdn=gdn, kv=kv, next_position=0, mtp_kv=mtp_kv)

    def clone(self) -> "SequenceState":
        """A deep copy: resuming from it later is identical to continuing this state now."""
        return SequenceState(
            gdn={i: s.clone() for i, s in self.gdn.items()},
            kv={i: c.clone() for i, c in self.kv.items()},
            next_position=self.next_position,
            mtp_kv=[c.clone() for c in self.mtp_kv],
            last_hidden=None if self.last_hidden is None else self.last_hidden.clone(),
        )


def _empty_kv(cfg: Qwen35Config, dtype: torch.dtype) -> KVCache:
    shape = (cfg.num_key_value_heads, 0, cfg.head_dim)
    return KVCache(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
