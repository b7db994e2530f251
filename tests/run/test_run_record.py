"""The run record both drivers, the sweep and eval share: open/resume, tags, config params, run-id file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commrl import tracking
from commrl.run import record

IDENTITY = record.RunIdentity("tiny", "method", 2, "lowrank", "local", 40, 30)


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    return tracking.init_store(tracking_uri=f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}")


def test_a_new_run_has_the_full_tag_set_and_its_id_file(uri, tmp_path):
    spec = record.RunSpec("trial", "parent0", "tiny/study/trial0001", {"optuna.trial": "1"})
    run_id, resumed = record.open_run(IDENTITY, tmp_path, uri, spec)
    run = tracking.client(uri).get_run(run_id)
    assert not resumed and run.info.run_name == "tiny/study/trial0001" and run.info.status == "RUNNING"
    assert {k: run.data.tags[k] for k in ("pair", "condition", "codec", "seed", "driver")} == {
        "pair": "tiny",
        "condition": "method",
        "codec": "lowrank",
        "seed": "2",
        "driver": "local",
    }
    assert (run.data.tags["ticks"], run.data.tags["read_at"], run.data.tags["kind"]) == ("40", "30", "trial")
    assert run.data.tags["mlflow.parentRunId"] == "parent0" and run.data.tags["optuna.trial"] == "1"
    assert (tmp_path / record.RUN_ID_FILE).read_text() == run_id + "\n"


def test_a_rerun_reopens_the_run_and_refreshes_tags_a_lost_run_starts_anew(uri, tmp_path):
    run_id, _ = record.open_run(IDENTITY, tmp_path, uri)
    record.finish_run(run_id, "FAILED", tracking_uri=uri)
    longer = record.RunIdentity("tiny", "method", 2, "lowrank", "local", 60, 30)
    assert record.open_run(longer, tmp_path, uri) == (run_id, True)
    run = tracking.client(uri).get_run(run_id)
    assert run.info.status == "RUNNING" and run.data.tags["ticks"] == "60"
    (tmp_path / record.RUN_ID_FILE).write_text("0123456789abcdef\n")  # a store that lost the run
    new_id, resumed = record.open_run(IDENTITY, tmp_path, uri)
    assert not resumed and new_id != run_id and record.written_run_id(tmp_path) == new_id


def test_a_resume_deletes_a_failed_attempts_end_tags_and_keeps_the_preemption(uri, tmp_path):
    """A run preempted, then failed, then stopped early and resumed once more ends with no failure or stop
    tag of those attempts; the preemption stays on record (``preempted``: the tick, ``preempted_by``)."""
    client = tracking.client(uri)
    run_id, _ = record.open_run(IDENTITY, tmp_path, uri)
    record.mark_preempted(run_id, 12, "SIGUSR1", uri)
    assert record.open_run(IDENTITY, tmp_path, uri) == (run_id, True)
    record.finish_run(run_id, "FAILED", {"failure": "boom"}, uri)
    record.open_run(IDENTITY, tmp_path, uri)
    assert "failure" not in client.get_run(run_id).data.tags
    record.finish_run(run_id, "FINISHED", {"stopped_early": "pruned"}, uri)
    record.open_run(IDENTITY, tmp_path, uri)
    record.finish_run(run_id, "FINISHED", tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and not set(record.ATTEMPT_TAGS) & set(run.data.tags)
    assert (run.data.tags["preempted"], run.data.tags["preempted_by"], run.data.tags["pair"]) == (
        "12",
        "SIGUSR1",
        "tiny",
    )


def test_a_store_that_does_not_answer_fails_the_resume_and_starts_no_second_run(uri, tmp_path, monkeypatch):
    """Only "no such run" starts a new run: a locked sqlite file or a tracking server that does not answer
    raises, the run-id file keeps the first run and the store gains no run. The store's error is injected
    (MLflow's own exception and code for a locked sqlite file): a real lock takes MLflow 20 s to report."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE
    from mlflow.tracking import MlflowClient

    run_id, _ = record.open_run(IDENTITY, tmp_path, uri)
    record.finish_run(run_id, "KILLED", tracking_uri=uri)
    client = tracking.client(uri)
    before = len(client.search_runs([client.get_run(run_id).info.experiment_id]))

    def locked(self, run_id):
        raise MlflowException("(sqlite3.OperationalError) database is locked", TEMPORARILY_UNAVAILABLE)

    monkeypatch.setattr(MlflowClient, "get_run", locked)
    with pytest.raises(MlflowException, match="database is locked"):
        record.open_run(IDENTITY, tmp_path, uri)
    monkeypatch.undo()
    assert record.written_run_id(tmp_path) == run_id
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == before
    assert record.open_run(IDENTITY, tmp_path, uri) == (run_id, True)  # the store answers again: resumed


def test_log_config_on_a_resume_logs_new_keys_and_records_changed_ones(uri, tmp_path):
    """MLflow params are immutable: a changed value must not fail (verl would drop its MLflow backend)."""
    run_id, _ = record.open_run(IDENTITY, tmp_path, uri)
    assert record.log_config(run_id, {"rl": {"ticks": 40, "lr": 1e-4}}, uri) == {}
    changed = record.log_config(run_id, {"rl": {"ticks": 60, "lr": 1e-4}, "new": "x"}, uri)
    assert changed == {"rl.ticks": ("40", "60")}
    run = tracking.client(uri).get_run(run_id)
    assert run.data.params == {"rl.ticks": "40", "rl.lr": "0.0001", "new": "x"}
    assert run.data.tags["config_changed"] == "rl.ticks"
    artifacts = [a.path for a in tracking.client(uri).list_artifacts(run_id, "config")]
    [path] = [a for a in artifacts if a.startswith("config/changed_")]
    local = tracking.client(uri).download_artifacts(run_id, path, str(tmp_path / "dl"))
    assert json.loads(Path(local).read_text()) == {"rl.ticks": {"logged": "40", "now": "60"}}


def test_run_spec_travels_as_json_and_bad_json_is_named():
    spec = record.RunSpec("trial", "p", "n", {"a": "1"})
    assert record.RunSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="is not a JSON object with kind/parent_run_id/run_name/tags"):
        record.RunSpec.from_json("[1, 2]")
