"""The reference Qwen3.5 model: plain torch on CPU, fp32 by default, fp64 on request. It is the oracle.

Weights are a mapping keyed by the logical names of :mod:`ninfer.models.qwen3_5.params`; all sequence state is
explicit in a :class:`SequenceState` that the caller owns, clones and resumes.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

from ninfer.models.qwen3_5.config import FULL, Qwen35Config
from ninfer.models.qwen3_5.params import MTP, TEXT, layer_of, logical_parameters

from .attention import gated_attention
from .gdn import chunk_ends, gdn_mixer
from .layer import decoder_layer
from .mtp import mtp_hidden
from .norms import zc_rms_norm
from .scope import Scope
from .state import GDNState, SequenceState


class ReferenceModel:
    """Qwen3.5 forward passes over explicit state. ``dtype`` is the activation/weight dtype (fp32 default, fp64 for
    the exact mode); gates, norms and the recurrent state S always run in at least fp32."""

    stages = None  # (StagePlan, StageLink) of a model cut into pipeline stages (`placed`), else None

    def __init__(self, cfg: Qwen35Config, weights: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32):
        self.cfg = cfg
        self.dtype = dtype
        self.has_mtp = cfg.mtp_num_hidden_layers > 0 and any(k.startswith("mtp.") for k in weights)
        self.weights = _prepare_weights(cfg, weights, dtype, self.has_mtp)
        self.root = Scope(self.weights, "")

    def with_weights(self, replaced: Mapping[str, torch.Tensor]) -> "ReferenceModel":
        """A new model object over these weights with `replaced` in place of theirs (the others shared; this model
        unchanged): the MTP head's FP8 draft weights (`draft_quant.fp8_values`)."""
        out = copy.copy(self)
        out.weights = {**self.weights, **replaced}
        out.root = Scope(out.weights, "")
        return out

    def placed(self, plan, link) -> "ReferenceModel":
        """This model cut into `plan`'s pipeline stages (`ninfer.pipeline.StagePlan`): each layer's weights on its
        rank's device, the embedding, final norm, head and MTP head on rank 0's, and the residual passed through
        `link` (a `StageLink`) at every stage boundary and from the last stage back to rank 0. A new model object
        over the same (or moved) tensors; this one is unchanged."""
        staged = copy.copy(self)
        staged.weights = {name: w.to(plan.devices[0 if layer_of(name) is None else plan.rank_of(layer_of(name))])
                          for name, w in self.weights.items()}
        staged.root = Scope(staged.weights, "")
        staged.stages = (plan, link)
        return staged

    def new_state(self) -> SequenceState:
        return SequenceState.empty(self.cfg, self.dtype)

    def prefill(self, tokens: torch.Tensor, state: SequenceState, chunked: bool = True, return_hidden: bool = False,
                checkpoints: list[SequenceState] | None = None, taps: dict[int, torch.Tensor] | None = None,
                positions: torch.Tensor | None = None, embeds: tuple[torch.Tensor, torch.Tensor] | None = None,
                at: Sequence[int] | None = None):
        """Consume ``tokens`` [T] at positions ``state.next_position ..``; ``state`` is advanced in place.

        ``positions`` [3, T]: their MRoPE positions (a prompt with images), else the sequence indices in all rows.
        ``embeds`` (rows [n], features [n, H]): those rows' token embeddings replaced (image features at the pads).

        Returns logits [T, V], or (logits, hidden [T, H]) with ``return_hidden`` (final-normed: the MTP input).
        With ``chunked`` the GDN layers use the 64-token parallel form, chunks aligned to this call's start; when
        ``checkpoints`` is a list, a complete state at every interior chunk boundary (positions start+64,
        start+128, ... < start+T) is appended to it, taken from the chunked form's boundary states; with ``at``
        (offsets ascending strictly inside (0, T)) the chunks restart at each of them and only their states are
        appended, each equal to the state a prefill ending there reaches. When ``taps``
        is a dict, it receives every layer's output [T, H] by layer index (HF's ``hidden_states[i + 1]``: the last
        layer's is the final-normed one), what a drafter conditions on.
        """
        if tokens.ndim != 1 or tokens.numel() == 0:
            raise ValueError(f"prefill takes a non-empty 1-D token tensor, got shape {tuple(tokens.shape)}")
        if checkpoints is not None and not chunked:
            raise ValueError("chunk-boundary checkpoints come from the chunked GDN form; pass chunked=True")
        cuts = tuple(at or ())
        if at is not None and (checkpoints is None or list(cuts) != sorted(set(cuts)) or
                               any(not 0 < c < tokens.numel() for c in cuts)):
            raise ValueError(f"checkpoint offsets {list(cuts)} need a checkpoints list and must ascend strictly "
                             f"inside (0, {tokens.numel()})")
        start = state.next_position
        per_layer: dict[int, list[GDNState]] | None = None if checkpoints is None else {}
        hidden = self._forward(tokens, state, chunked, per_layer, taps, positions, embeds, cuts)
        if checkpoints is not None:
            checkpoints.extend(self._boundary_states(state, start, hidden, per_layer, cuts, at is not None))
        logits = self.logits(hidden)
        return (logits, hidden) if return_hidden else logits

    def decode_step(self, token: int | torch.Tensor, state: SequenceState, return_hidden: bool = False,
                    taps: dict[int, torch.Tensor] | None = None, positions: torch.Tensor | None = None):
        """One token through the step recurrence; returns logits [V] (and the hidden [H] with ``return_hidden``);
        ``taps`` as for `prefill` ([1, H] each), ``positions`` [3, 1] too."""
        tokens = torch.as_tensor(token, dtype=torch.long).reshape(1)
        hidden = self._forward(tokens, state, chunked=False, per_layer=None, taps=taps, positions=positions)
        logits = self.logits(hidden)[0]
        return (logits, hidden[0]) if return_hidden else logits

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden [T, H] -> logits [T, V] through the (possibly tied) lm_head."""
        return F.linear(hidden, self.weights["lm_head.weight"])

    def _forward(self, tokens: torch.Tensor, state: SequenceState, chunked: bool,
                 per_layer: dict[int, list[GDNState]] | None, taps: dict[int, torch.Tensor] | None = None,
                 positions: torch.Tensor | None = None, embeds: tuple[torch.Tensor, torch.Tensor] | None = None,
                 cuts: Sequence[int] = ()) -> torch.Tensor:
        """Embed -> layers -> final norm; returns the final-normed hidden [T, H] and advances ``state``."""
        cfg = self.cfg
        _check_tokens(tokens, cfg.vocab_size)
        _check_state(cfg, state)
        if positions is not None and tuple(positions.shape) != (3, tokens.numel()):
            raise ValueError(f"positions of shape {tuple(positions.shape)} for {tokens.numel()} tokens; expected "
                             f"[3, {tokens.numel()}]")
        x = self.weights["embed_tokens.weight"][tokens]  # [T, H]
        if embeds is not None:
            rows, features = embeds
            x = x.clone()
            x[rows] = features.to(x.dtype)
        rank = 0
        for i, kind in enumerate(cfg.layer_types):
            if self.stages is not None and self.stages[0].rank_of(i) != rank:  # the residual to the next stage
                x, rank = self.stages[1].pass_on(x, rank, self.stages[0].rank_of(i)), self.stages[0].rank_of(i)
            lw = self.root.sub(f"layers.{i}")
            if kind == FULL:
                mixer = partial(gated_attention, w=lw.sub("self_attn"), cfg=cfg, cache=state.kv[i],
                                positions=positions)
            else:
                sink = None if per_layer is None else per_layer.setdefault(i, [])
                mixer = partial(gdn_mixer, w=lw.sub("linear_attn"), cfg=cfg, state=state.gdn[i], chunked=chunked,
                                boundaries=sink, cuts=cuts)
            x = decoder_layer(x, lw, cfg, mixer)
            if taps is not None:  # a later stage hands its layers' outputs to rank 0, where a drafter reads them
                taps[i] = x if rank == 0 else self.stages[1].pass_on(x, rank, 0)
        if rank:  # back from the last stage: the final norm and the head run on rank 0
            x = self.stages[1].pass_on(x, rank, 0)
        hidden = zc_rms_norm(x, self.weights["norm.weight"], cfg.rms_norm_eps)
        if taps is not None:
            taps[cfg.num_hidden_layers - 1] = hidden
        state.next_position += tokens.numel()
        state.last_hidden = hidden[-1].clone()
        return hidden

    def _boundary_states(self, state: SequenceState, start: int, hidden: torch.Tensor,
                         per_layer: dict[int, list[GDNState]], cuts: Sequence[int], only_cuts: bool
                         ) -> list[SequenceState]:
        """Assemble complete checkpoints at the interior chunk boundaries of the prefill that just ran (at the
        cuts only, when asked)."""
        out = []
        for n, offset in enumerate(chunk_ends(hidden.shape[0], cuts)[:-1]):
            if only_cuts and offset not in cuts:
                continue
            pos = start + offset
            out.append(SequenceState(
                gdn={i: states[n] for i, states in per_layer.items()},
                kv={i: c.truncated(pos) for i, c in state.kv.items()},
                next_position=pos,
                mtp_kv=[c.truncated(pos) for c in state.mtp_kv],
                last_hidden=hidden[offset - 1].clone(),
            ))
        return out

    def mtp_forward(self, hidden: torch.Tensor, next_tokens: torch.Tensor, state: SequenceState, step: int = 0,
                    return_hidden: bool = False, positions: torch.Tensor | None = None,
                    embeds: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Draft logits [T, V] from hidden [T, H] and the token after each, next_tokens [T].

        Uses MTP layer ``step % mtp_num_hidden_layers`` and extends that layer's KV in ``state.mtp_kv``.
        With ``return_hidden`` also returns the MTP output h' [T, H] (the hidden for a chained draft).
        ``positions`` [3, T] (MRoPE, a sequence with images) and ``embeds`` (image rows of next_tokens) as for
        `mtp_hidden`.
        """
        if not self.has_mtp:
            raise RuntimeError("this model was built without MTP weights (no 'mtp.*' tensors)")
        if hidden.ndim != 2 or next_tokens.shape != hidden.shape[:1]:
            raise ValueError(f"mtp_forward: hidden {tuple(hidden.shape)} and next_tokens "
                             f"{tuple(next_tokens.shape)} must be [T, H] and [T]")
        _check_tokens(next_tokens, self.cfg.vocab_size)
        layer = step % self.cfg.mtp_num_hidden_layers
        h = mtp_hidden(hidden.to(self.dtype), next_tokens, self.root, self.cfg, state.mtp_kv[layer], layer,
                       positions, embeds)
        logits = self.logits(h)
        return (logits, h) if return_hidden else logits


def _check_tokens(tokens: torch.Tensor, vocab: int) -> None:
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab}), got range [{int(tokens.min())}, {int(tokens.max())}]")


def _check_state(cfg: Qwen35Config, state: SequenceState) -> None:
    """Refuse a state of another geometry or with inconsistent KV before anything is mutated."""
    if sorted(state.gdn) != list(cfg.linear_layers) or sorted(state.kv) != list(cfg.attention_layers):
        raise ValueError(f"state layers (GDN {sorted(state.gdn)}, attention {sorted(state.kv)}) do not match the "
                         f"config (GDN {list(cfg.linear_layers)}, attention {list(cfg.attention_layers)})")
    for i, cache in state.kv.items():
        if cache.length != state.next_position:
            raise ValueError(f"state: layer {i} KV holds {cache.length} positions but next_position is "
                             f"{state.next_position}")


def _prepare_weights(cfg: Qwen35Config, weights: Mapping[str, torch.Tensor], dtype: torch.dtype,
                     with_mtp: bool) -> dict[str, torch.Tensor]:
    """Check names and shapes against the logical parameter table and cast: ``fp32``-kind parameters (A_log,
    dt_bias) to at least fp32, everything else to ``dtype``. A tied lm_head falls back to the embedding."""
    specs = logical_parameters(cfg, (TEXT, MTP) if with_mtp else (TEXT,))
    fp32 = torch.float64 if dtype == torch.float64 else torch.float32
    out: dict[str, torch.Tensor] = {}
    for name, spec in specs.items():
        src = weights.get(name)
        if src is None and name == "lm_head.weight" and cfg.tie_word_embeddings:
            src = weights.get("embed_tokens.weight")
        if src is None:
            raise KeyError(f"reference model: missing weight {name!r}")
        if tuple(src.shape) != spec.shape:
            raise ValueError(f"reference model: weight {name!r} has shape {tuple(src.shape)}, expected {spec.shape}")
        out[name] = src.to(fp32 if spec.kind == "fp32" else dtype)
    if cfg.tie_word_embeddings:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out
