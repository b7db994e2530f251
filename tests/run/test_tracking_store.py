"""A sqlite tracking store on a file system a cluster's nodes share is refused inside a Slurm job."""

from __future__ import annotations

import pytest

from commrl import tracking
from commrl.errors import ConfigError


def mounts(tmp_path, shared: str, kind: str = "nfs4"):
    """A /proc/mounts of this machine's root and ``shared`` mounted from a file server."""
    path = tmp_path / "mounts"
    path.write_text(
        "overlay / overlay rw,relatime 0 0\n"
        f"fileserver:/export/proj {shared} {kind} rw,vers=4.2 0 0\n"
        "tmpfs /dev/shm tmpfs rw 0 0\n"
    )
    return path


def test_the_file_system_of_a_path_is_its_longest_mount_point(tmp_path):
    table = mounts(tmp_path, "/shared/proj")
    assert tracking.filesystem_type(tmp_path / "x.db", table) == "overlay"
    assert tracking.filesystem_type(tracking.Path("/shared/proj/results"), table) == "nfs4"
    assert tracking.filesystem_type(tracking.Path("/shared/projects"), table) == "overlay"  # not under it
    assert tracking.filesystem_type(tmp_path, tmp_path / "no-such-file") is None


def test_sqlite_on_a_shared_file_system_is_refused_in_a_slurm_job_with_the_fix(tmp_path, monkeypatch):
    table = mounts(tmp_path, "/shared/proj", "lustre")
    uri = "sqlite:////shared/proj/results/mlflow.db"
    tracking.check_store(uri, table)  # outside Slurm: one machine, allowed
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    with pytest.raises(ConfigError, match=r"on a lustre file system .* export MLFLOW_TRACKING_URI=http://"):
        tracking.check_store(uri, table)
    tracking.check_store(f"sqlite:///{tmp_path / 'mlflow.db'}", table)  # node-local disk: allowed
    tracking.check_store("http://login:5055", table)  # a tracking server: allowed
