"""The draft draws' graph variants: which of docs/sampling.md's steps a draft graph runs.

A variant is a sampling variant (``rows.py``: greedy, sample, top-k, sort) whose draws run steps 1-4 (logit bias,
grammar mask, min_tokens, penalties) as identities for rows without their flags, or its lean form (``LEAN``) for a
round none of whose rows has one of them, which skips those steps: about 35 full-vocabulary launches a draft
position. The round's own steps (``Steps.of`` over its rows) pick the variant (``draw_variant``); the draft graphs
are captured per variant (``DRAW_VARIANTS``) and run ``draw_steps(variant)``, as the eager draws do.
"""

from __future__ import annotations

import dataclasses

from .rows import GREEDY, SAMPLE, SORT, TOP_K
from .spec_steps import Steps

# the steps of a draft draw per graph variant (rows.py): steps 1-4 always (each an identity for a row without its
# flag); the random ones with min-p (an identity at 0), the cutoff variants with top-k/top-p
DRAW_STEPS = {GREEDY: Steps(bias=True, min_tokens=True, penalties=True),
              SAMPLE: Steps(bias=True, min_tokens=True, penalties=True, random=True, min_p=True),
              TOP_K: Steps(bias=True, min_tokens=True, penalties=True, random=True, sort=True, bounded=True,
                           min_p=True),
              SORT: Steps(bias=True, min_tokens=True, penalties=True, random=True, sort=True, min_p=True)}


# a variant's lean form: a round none of whose rows has a logit bias, min_tokens or a penalty skips steps 1-4 (about
# 35 full-vocabulary launches a draft position)
LEAN = "+lean"
DRAW_VARIANTS = tuple(v + lean for v in DRAW_STEPS for lean in ("", LEAN))


def draw_variant(steps: Steps) -> str:
    """The draft graph variant whose steps cover `steps` (the round's own): the lean form where steps 1-4 are off."""
    base = (TOP_K if steps.bounded else SORT) if steps.sort else (SAMPLE if steps.random else GREEDY)
    return base if steps.adjusts else base + LEAN


def draw_steps(variant: str) -> Steps:
    """The steps a draft graph of `variant` runs."""
    if variant.endswith(LEAN):
        return dataclasses.replace(DRAW_STEPS[variant[:-len(LEAN)]], bias=False, min_tokens=False, penalties=False)
    return DRAW_STEPS[variant]


def base_variant(variant: str) -> str:
    """The sampling variant (rows.py) a draft variant draws with."""
    return variant.removesuffix(LEAN)
