from .naive import greedy_draw_naive, record_draft
from .triton import greedy_draw

__all__ = ["greedy_draw", "greedy_draw_naive", "record_draft"]
