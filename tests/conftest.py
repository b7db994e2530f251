"""Suite-wide ordering: the two end-to-end files run first.

`make test` runs the suite on two pytest-xdist workers, one test file per work unit (`--dist loadfile`). The
whole-pipeline file (~6 minutes, `snakemake --cores 2`) and the Slurm file (~5 minutes, mostly waiting on
the scheduler) start at once on different workers and the unit files fill the time around them; in
collection order they would come last, one after the other. pytest-xdist (since 3.7) reorders the files
of `--dist loadfile` by their number of tests, which put these two files, with ten tests between them,
last: they started 10 and 18 minutes into a fresh clone's 25-minute suite, on a machine idle by then but
for them. `pytest_configure` turns that reordering off (`--no-loadscope-reorder`).
"""

from __future__ import annotations

import pytest

FIRST = ("tests/workflow/test_pipeline_e2e.py", "tests/workflow/test_slurm.py")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist is installed
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return FIRST.index(path) if path in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order
