"""Fixtures of the workflow tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from snakemake_run import Workflow


@pytest.fixture
def workflow(tmp_path: Path) -> Workflow:
    """A copy of the workflow of its own under tmp_path."""
    return Workflow(tmp_path)
