"""Fixtures of the run-bookkeeping and fork-server tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from forkserver_helpers import Server


@pytest.fixture
def server() -> Iterator[Server]:
    """A fork server for one test, stopped after it unless the test stopped it."""
    srv = Server()
    yield srv
    if srv.proc.poll() is None:
        srv.stop()
