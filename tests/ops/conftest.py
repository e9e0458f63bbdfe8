"""Ops tests run twice over: on CPU through the Triton interpreter at tiny shapes, and on a GPU at real shapes.

``NINFER_TEST_DEVICE=cuda`` (with a visible GPU) selects the GPU; anything else runs on CPU, where
``TRITON_INTERPRET=1`` must be set before triton is first imported: ``_device`` does that at collection time.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _device  # noqa: F401  (sets TRITON_INTERPRET before any kernel module imports triton)
from ninfer.testing.numerics import nan_poisoning


@pytest.fixture(autouse=True)
def _poison_and_seed():
    torch.manual_seed(42)
    with nan_poisoning():
        yield
