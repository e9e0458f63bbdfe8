from .naive import gumbel_race_naive
from .triton import RaceWorkspace, gumbel_race

__all__ = ["RaceWorkspace", "gumbel_race", "gumbel_race_naive"]
