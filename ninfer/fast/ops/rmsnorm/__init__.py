from .naive import rmsnorm_naive
from .triton import rmsnorm

__all__ = ["rmsnorm", "rmsnorm_naive"]
