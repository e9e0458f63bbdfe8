"""The MTP (multi-token prediction) head: predicts token t+2 from the hidden of t and the token t+1.

    e = norm_emb(Embed[x_{t+1}]);  hn = norm_hid(h_t);  u = fc(concat([e, hn]))      (embedding first)
    h' = mtp.norm(FullAttentionDecoderLayer(u));  logits = lm_head(h')                  (shared embed / lm_head)

``h_t`` is the main model's final-normed hidden (the lm_head input) for the first draft, and the previous MTP
output ``h'`` for chained drafts. The MTP layer keeps its own KV; a pair is placed at position = that KV's length,
which equals the position of ``h_t`` when the MTP consumes every position in order (vLLM's convention). After a
prompt with images the pair rotates at h_t's MRoPE position (``positions`` [3, T]), and an image token x_{t+1} is
embedded as the target embedded it, by its image feature (``embeds``): the head sees the row the target consumed.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from ninfer.models.qwen3_5.config import Qwen35Config

from .attention import gated_attention
from .layer import decoder_layer
from .norms import zc_rms_norm
from .scope import Scope
from .state import KVCache


def mtp_hidden(hidden: torch.Tensor, next_tokens: torch.Tensor, root: Scope, cfg: Qwen35Config,
               cache: KVCache, layer: int = 0, positions: torch.Tensor | None = None,
               embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """hidden [T, H] (positions p..p+T-1), next_tokens [T] (the token after each) -> MTP output h' [T, H].

    ``cache`` is MTP layer ``layer``'s KV and is extended by T positions; ``positions`` [3, T] their MRoPE
    positions (else the KV indices), ``embeds`` (rows [n], features [n, H]) the rows of next_tokens embedded by an
    image's features instead of the embedding table.
    """
    eps = cfg.rms_norm_eps
    w = root.sub("mtp")
    x = root["embed_tokens.weight"][next_tokens]  # [T, H]
    if embeds is not None:
        x = x.clone()
        x[embeds[0]] = embeds[1].to(x.dtype)
    e = zc_rms_norm(x, w["pre_fc_norm_embedding.weight"], eps)
    hn = zc_rms_norm(hidden, w["pre_fc_norm_hidden.weight"], eps)
    u = F.linear(torch.cat([e, hn], dim=-1), w["fc.weight"])  # [T, H]
    lw = w.sub(f"layers.{layer}")
    u = decoder_layer(u, lw, cfg, partial(gated_attention, w=lw.sub("self_attn"), cfg=cfg, cache=cache,
                                          positions=positions))
    return zc_rms_norm(u, w["norm.weight"], eps)
