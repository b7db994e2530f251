"""The fork server (``commrl.run.forkserver``): a job through it is the job in its own process.

A real server (a subprocess, preloading one light module so that the tests start fast) and real ``commrl``
commands as clients; training through it (identity, preemption, kills): tests/rl/test_forkserver_train.py.
"""

from __future__ import annotations

import os
import sys

from forkserver_helpers import commrl, direct_env

from commrl.run import forkserver


def test_a_job_through_the_server_prints_and_exits_as_in_its_own_process(server, tmp_path):
    for args in (
        ("train", "--cfg", "pair=tiny", "condition=dense"),  # exit 0, the resolved config on stdout
        ("train", "pair=tiny", "rl.ticks=0"),  # a ConfigError: exit 2, the message on stderr
        ("prepare", "--dataset", "nope", "--out", "x"),  # argparse's SystemExit(2) inside the fork
        ("eval", "--help"),  # SystemExit(0), the help on stdout
    ):
        alone = commrl(*args, env=direct_env(), cwd=tmp_path)
        forked = commrl(*args, env=server.env(), cwd=tmp_path)
        assert (forked.returncode, forked.stdout, forked.stderr) == (
            alone.returncode,
            alone.stdout,
            alone.stderr,
        ), args
    assert server.stop() == 4


def test_the_job_runs_in_its_callers_directory_and_environment(server, tmp_path):
    result = commrl(
        "prepare", "--dataset", "toy", "--seed", "0", "--out", "rel/toy", env=server.env(), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "rel" / "toy" / "train.parquet").is_file()  # the client's cwd, not the server's
    assert "toy: 6000 rows in" in result.stdout  # the client's own stdout descriptor
    assert server.stop() == 1


def test_an_import_time_variable_that_differs_runs_the_job_in_its_own_process(server, tmp_path):
    result = commrl("train", "--cfg", "pair=tiny", env=server.env(ATEN_CPU_CAPABILITY="avx2"), cwd=tmp_path)
    assert result.returncode == 0 and "pair: tiny" in result.stdout
    assert "refused the job (ATEN_CPU_CAPABILITY differs from the server's)" in result.stderr
    inside_slurm = commrl("train", "--cfg", "pair=tiny", env=server.env(SLURM_JOB_ID="7"), cwd=tmp_path)
    assert inside_slurm.returncode == 0 and inside_slurm.stderr == ""  # its allocation's own process
    assert server.stop() == 0


def test_no_server_at_the_path_runs_the_job_here(tmp_path):
    env = {**direct_env(), forkserver.ENV_VAR: str(tmp_path / "gone")}
    result = commrl("train", "--cfg", "pair=tiny", env=env)
    assert result.returncode == 0 and "pair: tiny" in result.stdout
    assert "not reachable" in result.stderr and "running in this process" in result.stderr


def test_import_time_difference_ignores_thread_counts_and_unrelated_variables():
    server = {"HOME": "/root", "OMP_NUM_THREADS": "2", "HF_HOME": "/h"}
    assert (
        forkserver.import_time_difference(server, {**server, "OMP_NUM_THREADS": "1", "SNAKEMAKE_X": "1"})
        is None
    )
    assert forkserver.import_time_difference(server, {**server, "HF_HOME": "/other"}) == "HF_HOME"
    assert (
        forkserver.import_time_difference(server, {**server, "DNNL_MAX_CPU_ISA": "AVX2"})
        == "DNNL_MAX_CPU_ISA"
    )
    assert forkserver.import_time_difference(server, {"HOME": "/root", "OMP_NUM_THREADS": "2"}) == "HF_HOME"


def test_run_with_server_gives_the_commands_status_and_stops_the_server(tmp_path):
    probe = tmp_path / "probe"
    script = (
        f"import os, sys; open({str(probe)!r}, 'w').write(os.environ[{forkserver.ENV_VAR!r}]); sys.exit(5)"
    )
    assert forkserver.run_with_server([sys.executable, "-c", script]) == 5
    socket_path = probe.read_text()
    assert socket_path and not os.path.exists(socket_path)  # the server stopped and its folder is gone


def test_a_server_that_dies_in_its_preload_is_not_ready_and_leaves_nothing_behind():
    server = forkserver.ServerProcess(preload=("sys:exit",))  # SystemExit is not a skipped import failure
    assert not server.wait(ready=True, timeout_s=60)
    assert server.proc.poll() is not None
    assert server.stop() is None  # it never said how many jobs it served
    assert not server.folder.exists()
