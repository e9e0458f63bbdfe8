"""Fast-model tests: on CPU through the Triton interpreter at tiny shapes, on a GPU (``NINFER_TEST_DEVICE=cuda``)
at larger shapes. ``_fast_env`` sets ``TRITON_INTERPRET`` before any kernel module imports triton."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _fast_env  # noqa: F401,E402  (sets TRITON_INTERPRET before triton is imported)
from ninfer.testing.numerics import nan_poisoning  # noqa: E402


@pytest.fixture(autouse=True)
def _poison_and_seed():
    # single-threaded torch comes from tests/conftest.py (_ONE_THREAD_AREAS)
    torch.manual_seed(7)
    with nan_poisoning():
        yield
