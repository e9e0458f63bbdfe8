from .naive import dflash_conv_naive
from .triton import dflash_conv

__all__ = ["dflash_conv", "dflash_conv_naive"]
