"""Suite-wide ordering: the two end-to-end files run first.

`make test` runs the suite on two pytest-xdist workers, one test file per work unit (`--dist loadfile`). The
whole-pipeline file (~6 minutes, `snakemake --cores 2`) and the Slurm file (~5 minutes, mostly waiting on
the scheduler) start at once on different workers and the unit files fill the time around them; in
collection order they would come last, one after the other.
"""

from __future__ import annotations

import pytest

FIRST = ("tests/workflow/test_pipeline_e2e.py", "tests/workflow/test_slurm.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return FIRST.index(path) if path in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order
