from .naive import dflash_walk_naive
from .triton import dflash_walk

__all__ = ["dflash_walk", "dflash_walk_naive"]
