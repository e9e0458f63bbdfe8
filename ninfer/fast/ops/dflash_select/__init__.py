from .naive import dflash_select_naive
from .triton import dflash_select

__all__ = ["dflash_select", "dflash_select_naive"]
