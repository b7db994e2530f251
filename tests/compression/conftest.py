"""Fixtures of the compression tests (helpers live in compression_helpers.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(1)
    yield
