"""Hunts whose examples follow from their seed and the code they hunt in, not from what the process imported.

Hypothesis (6.131 and later) draws some integers, floats and strings from a pool of the literal constants of every
local module imported so far (`hypothesis.internal.conjecture.providers._get_local_constants`), so a derandomized
hunt generated other examples when the process happened to have imported one more `ninfer` module before it
(another test file, a lazy import in an earlier test): a mutant hunt that must catch its bug within a fixed budget
passed or failed by test order. ``fixed_constants`` gives the hunt a pool of its own for its duration: the
constants of the packages it exercises (the Engine, the Program core, the contracts, the harness and the toy
Program), every module of them imported first, so the pool is the same whatever ran before. (An empty pool is
not the answer: the engine's own constants are what finds some bugs; the backfill mutant, for one, escapes 200
examples without them.)
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis.internal.conjecture import providers
from hypothesis.internal.constants_ast import Constants, constants_from_module
from hypothesis.internal.floats import float_to_int
from sortedcontainers import SortedSet

HUNTED_CODE = ("ninfer.contracts", "ninfer.engine", "ninfer.program_core", "ninfer.testing.harness",
               "ninfer.testing.toy_program")


def _modules(names: tuple[str, ...]) -> list:
    """The named modules and, for packages, every module below them, sorted by name."""
    found = {}
    for name in names:
        module = importlib.import_module(name)
        found[name] = module
        for info in pkgutil.walk_packages(getattr(module, "__path__", []), prefix=f"{name}."):
            found[info.name] = importlib.import_module(info.name)
    return [found[n] for n in sorted(found)]


@functools.cache
def pool(names: tuple[str, ...] = HUNTED_CODE) -> Constants:
    """The literal constants of `names`' modules, in sorted sets (draws index them: their order is part of the
    seed's meaning)."""
    out = Constants(integers=SortedSet(), floats=SortedSet(key=float_to_int), bytes=SortedSet(),
                    strings=SortedSet())
    for module in _modules(names):
        out = out | constants_from_module(module)
    return out


@contextmanager
def fixed_constants(names: tuple[str, ...] = HUNTED_CODE) -> Iterator[None]:
    """Draw constants from `pool(names)` alone while the block runs."""
    saved, own = providers._get_local_constants, pool(names)
    providers._get_local_constants = lambda: own
    providers.CONSTANTS_CACHE.cache.clear()  # the constants each constraint admitted, from the pool before
    try:
        yield
    finally:
        providers._get_local_constants = saved
        providers.CONSTANTS_CACHE.cache.clear()
