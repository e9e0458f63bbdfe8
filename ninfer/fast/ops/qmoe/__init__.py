from .naive import qmoe_experts_naive

__all__ = ["qmoe_experts_naive"]
