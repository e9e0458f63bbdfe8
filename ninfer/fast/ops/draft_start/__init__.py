from .naive import draft_start_naive
from .triton import draft_start

__all__ = ["draft_start", "draft_start_naive"]
