"""``commrl report --only``: a pipeline's report reads the runs its files name, not a newer one-off run of
the same condition and seed in the same store (a real sqlite MLflow store, the runs' real summary files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commrl import tracking
from commrl.report import ReportInputError, build_report
from commrl.report.runs import load_pair
from commrl.report.selection import RunSelection
from commrl.run.summary import RunSummary

SCORE = {t: 0.3 + 0.01 * t for t in range(0, 21, 5)}


def _summary(out: Path, run_id: str) -> Path:
    summary = RunSummary("P", "method", 0, "local", 20, 20, run_id, None, 20, None)
    return summary.write(out)


def _eval(client, exp_id: str, parent: str, value: float, out: Path) -> Path:
    run = client.create_run(
        exp_id,
        run_name="eval",
        tags={"kind": "eval", "benchmark": "toy_greedy", "training_run_id": parent},
    )
    client.log_metric(run.info.run_id, "eval/toy_greedy/acc", value)
    client.set_terminated(run.info.run_id, "FINISHED")
    out.write_text(json.dumps({"benchmark": "toy_greedy", "mlflow_run_id": run.info.run_id}))
    return out


@pytest.fixture
def store(tmp_path, log_train_run):
    """Pair P: the pipeline's method seed 0 (score from 0.3) with its evaluation and sweep, then a one-off
    run of the same condition and seed (another setting, score from 0.9), its evaluation and a sweep."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.init_store(tracking_uri=uri)
    client = tracking.client(uri)
    exp = tracking.ensure_experiment(tracking.experiment_name("P"), uri, client)
    ours = log_train_run(client, exp, "P", "method", 0, {"score/mean": SCORE}, 20)
    files = [_summary(tmp_path / "runs" / "method" / "seed0", ours)]
    files.append(_eval(client, exp, ours, 0.5, tmp_path / "ours_eval.json"))
    for study in ("P-study", "other-study"):
        sweep = client.create_run(
            exp, run_name=f"sweep/{study}", tags={"kind": "sweep", "optuna.study": study}
        )
        client.set_terminated(sweep.info.run_id, "FINISHED")
    sweep_dir = tmp_path / "sweep" / "summary"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "best_params.json").write_text(json.dumps({"study": "P-study", "pair": "P"}))
    files.append(sweep_dir)
    theirs = log_train_run(
        client, exp, "P", "method", 0, {"score/mean": {t: v + 0.6 for t, v in SCORE.items()}}, 20
    )
    _eval(client, exp, theirs, 0.9, tmp_path / "their_eval.json")
    return uri, files, ours, theirs


def test_the_selected_runs_are_read_and_a_newer_one_off_run_is_left_out(store):
    uri, files, ours, theirs = store
    everything = load_pair("P", uri)
    assert [r.run_id for r in everything.train] == [theirs]  # without --only: the newest wins
    only = RunSelection.from_paths(files)
    selected = load_pair("P", uri, only)
    assert [r.run_id for r in selected.train] == [ours]
    assert selected.train[0].metrics["score/mean"].values[0] == pytest.approx(0.3)
    assert [(e.training_run_id, e.metrics) for e in selected.evals] == [(ours, {"acc": 0.5})]
    assert [s.study for s in selected.sweeps] == ["P-study"]
    assert "P: 1 training runs in the store left out: not among the runs of --only" in selected.notes
    assert "P: 1 sweeps in the store left out: not among the runs of --only" in selected.notes
    assert not any("dropped: a newer run" in n for n in selected.notes)


def test_a_run_folder_names_its_run_and_bad_paths_are_refused_with_the_fix(store, tmp_path):
    _, files, ours, _ = store
    assert RunSelection.from_paths([files[0].parent]).train == {ours}
    with pytest.raises(ReportInputError, match=r"nowhere\.json does not exist; run the rule that writes it"):
        RunSelection.from_paths([tmp_path / "nowhere.json"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportInputError, match=r"neither a training summary\.json"):
        RunSelection.from_paths([tmp_path / "empty"])
    (tmp_path / "toy_greedy.results.json").write_text(json.dumps({"results": {}}))
    with pytest.raises(ReportInputError, match=r"results\.json is neither a training summary\.json"):
        RunSelection.from_paths([tmp_path / "toy_greedy.results.json"])
    unlogged = tmp_path / "unlogged.json"
    unlogged.write_text(json.dumps({"benchmark": "toy_greedy", "mlflow_run_id": None}))
    with pytest.raises(ReportInputError, match="has no mlflow_run_id"):
        RunSelection.from_paths([unlogged])


def test_a_selected_run_missing_from_the_store_stops_the_report(store, tmp_path):
    uri, files, _, _ = store
    gone = _summary(tmp_path / "runs" / "gone", "0123456789abcdef")
    only = RunSelection.from_paths([*files, gone])
    with pytest.raises(ReportInputError, match=r"not in the MLflow store: .*gone/summary.json names 0123"):
        build_report(["P"], tmp_path / "report", tracking_uri=uri, only=only)


def test_a_sweep_summary_selects_its_own_parent_run_not_an_older_study_of_the_same_name(store, tmp_path):
    """A study started again under its name (its storage and trials removed, as ``sweep init`` says to) in
    the same MLflow store leaves the old parent run there: the summary names its parent run, so the report
    reads that one alone; a summary that names only the study (written before) still selects by name."""
    uri, files, _, _ = store
    client = tracking.client(uri)
    exp = tracking.ensure_experiment(tracking.experiment_name("P"), uri, client)
    parents = []
    for _ in range(2):
        run = client.create_run(exp, run_name="sweep/again", tags={"kind": "sweep", "optuna.study": "again"})
        client.set_terminated(run.info.run_id, "FINISHED")
        parents.append(run.info.run_id)
    summary = tmp_path / "again" / "summary"
    summary.mkdir(parents=True)
    best = {"study": "again", "pair": "P", "mlflow_parent_run_id": parents[1]}
    (summary / "best_params.json").write_text(json.dumps(best))
    selected = load_pair("P", uri, RunSelection.from_paths([*files, summary]))
    assert sorted(s.run_id for s in selected.sweeps if s.study == "again") == [parents[1]]
    assert sorted(s.study for s in selected.sweeps) == ["P-study", "again"]
    best.pop("mlflow_parent_run_id")
    (summary / "best_params.json").write_text(json.dumps(best))
    by_name = load_pair("P", uri, RunSelection.from_paths([*files, summary]))
    assert sorted(s.run_id for s in by_name.sweeps if s.study == "again") == sorted(parents)


def test_an_evaluation_on_a_limit_of_problems_does_not_stand_in_for_the_full_one(store, tmp_path):
    """``commrl eval --limit 5`` (a smoke test) after the pipeline's evaluation of the same run: a report
    without ``--only`` keeps the newest evaluation per run and benchmark, so it would read 5 problems; an
    evaluation with a limit is left out, with a note."""
    uri, _, _, theirs = store
    client = tracking.client(uri)
    exp = tracking.ensure_experiment(tracking.experiment_name("P"), uri, client)
    full = client.get_run(load_pair("P", uri).evals[0].run_id)
    client.log_param(full.info.run_id, "limit", "None")
    smoke = _eval(client, exp, theirs, 0.0, tmp_path / "smoke.json")
    client.log_param(json.loads(smoke.read_text())["mlflow_run_id"], "limit", "5")
    loaded = load_pair("P", uri)
    assert [(e.training_run_id, e.metrics) for e in loaded.evals] == [(theirs, {"acc": 0.9})]
    assert any("dropped: it read 5 problems a task (--limit)" in n for n in loaded.notes)


def test_a_run_stopped_early_is_named_in_the_notes(store):
    """A collapse alarm or a pruner ends a run FINISHED with ``stopped_early``: the report says so (its
    curves end early and its table cells read its last tick), where it named only runs not FINISHED."""
    uri, _, _, theirs = store
    tracking.client(uri).set_tag(theirs, "stopped_early", "collapse alarm at tick 12")
    notes = load_pair("P", uri).notes
    assert any(
        "method seed 0) stopped early (collapse alarm at tick 12): its curves end there" in n for n in notes
    ), notes
