from .layout import SampleInputs
from .naive import sample_naive
from .triton import SampleWorkspace, sample

__all__ = ["SampleInputs", "SampleWorkspace", "sample", "sample_naive"]
