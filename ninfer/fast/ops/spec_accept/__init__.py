from .naive import spec_accept_naive
from .triton import SpecAcceptWorkspace, spec_accept

__all__ = ["SpecAcceptWorkspace", "spec_accept", "spec_accept_naive"]
