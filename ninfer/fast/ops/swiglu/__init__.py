from .naive import swiglu_naive
from .triton import swiglu

__all__ = ["swiglu", "swiglu_naive"]
