"""Oracle tests run single-threaded torch: tiny models, and a busy 2-core runner oversubscribes threads badly."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
