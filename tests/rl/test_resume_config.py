"""The local driver resumes a run only under the config its checkpoint was trained with
(``commrl.run.fingerprint``): a changed setting is refused before any model loads, a longer run resumes, an
older checkpoint resumes with a warning."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from rl_helpers import overrides
from safetensors.torch import load_file, save_file

from commrl import tracking
from commrl.cli.main import main
from commrl.errors import ConfigError
from commrl.rl.config import load_train_config
from commrl.rl.trainer import LocalTrainer
from commrl.run import forkserver


def files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: (size, modification time in ns) by relative path."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


class Counting(LocalTrainer):
    """Records the ticks it trains."""

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.ticks: list[int] = []

    def _tick(self, tick):
        self.ticks.append(tick)
        return super()._tick(tick)


def test_a_changed_method_setting_is_refused_naming_it_and_the_run_is_left_as_it_was(
    tmp_path, toy_data, small_model, monkeypatch, capsys
):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "run"
    args = overrides(small_model, toy_data, out, uri, "condition=method", "rl.ticks=2", "rl.read_at=2")
    first = LocalTrainer(load_train_config(args)).train()
    before = files(out)
    monkeypatch.delenv(forkserver.ENV_VAR, raising=False)
    monkeypatch.setattr(LocalTrainer, "_setup", lambda self: pytest.fail("a model loaded"))
    capsys.readouterr()
    assert main(["train", *args, "method.projection=none", "method.rank=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"commrl train: error: {out} holds a run checkpointed at tick 2 under another config"
    )
    assert "method.projection: 'secant' -> 'none'" in err and "method.rank: 4 -> 2" in err
    assert "Restore these settings to resume it" in err and f"move or delete {out} to train" in err
    assert files(out) == before
    run = tracking.client(uri).get_run(first.mlflow_run_id)
    assert run.info.status == "FINISHED" and "config_changed" not in run.data.tags


def test_a_longer_run_resumes_and_equals_the_run_trained_straight(
    tmp_path, toy_data, small_model, monkeypatch
):
    """``rl.ticks`` and the read point extended past a finished run resume it, as do an out_dir now absolute
    and another checkpoint cadence (neither changes what is computed); a run cut below its checkpoint is
    refused."""
    monkeypatch.chdir(tmp_path)
    extra = ("condition=method", "tracking.enabled=false")
    LocalTrainer(
        load_train_config(
            [*overrides(small_model, toy_data, "run", "", *extra), "rl.ticks=2", "rl.read_at=2"]
        )
    ).train()
    longer = overrides(small_model, toy_data, tmp_path / "run", "", *extra, "checkpoint.every=1")  # 4 ticks
    resumed = Counting(load_train_config(longer))
    summary = resumed.train()
    assert (summary.ticks_trained, summary.complete, resumed.ticks) == (4, True, [2, 3])
    straight = LocalTrainer(
        load_train_config(overrides(small_model, toy_data, tmp_path / "straight", "", *extra))
    )
    straight.train()
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    with pytest.raises(ConfigError, match=r"rl\.ticks: 4 -> 3 \(the checkpoint is at tick 4"):
        LocalTrainer(load_train_config([*longer, "rl.ticks=3", "rl.read_at=3"])).train()


def test_an_extended_run_keeps_its_read_points_model(tmp_path, toy_data, small_model):
    """2 ticks read at 2, then extended to 4 with the read point kept: tick 2's weights (the first run's
    final model, the checkpoint restored) are exported as the read point, which the loop, starting past it,
    never reaches; the summary names it and evaluation reads it."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    args = overrides(small_model, toy_data, out, "", "condition=method", "tracking.enabled=false")
    first = LocalTrainer(load_train_config([*args, "rl.ticks=2", "rl.read_at=2"])).train()
    at_two = AutoModelForCausalLM.from_pretrained(first.final).state_dict()
    summary = LocalTrainer(load_train_config([*args, "rl.ticks=4", "rl.read_at=2"])).train()
    assert (summary.ticks_trained, summary.read) == (4, str(out / "tick2"))
    read = AutoModelForCausalLM.from_pretrained(summary.read).state_dict()
    assert all(torch.equal(read[k], at_two[k]) for k in at_two)


def test_a_metrics_line_cut_off_by_a_kill_does_not_stop_the_resume(tmp_path, toy_data, small_model):
    """A kill while the metrics table is appended leaves a last line without its newline; the resume cuts
    it (its tick is written again) instead of failing on it at every rerun."""
    import json

    out = tmp_path / "run"
    args = overrides(small_model, toy_data, out, "", "condition=method", "tracking.enabled=false")
    LocalTrainer(load_train_config([*args, "rl.ticks=2", "rl.read_at=2"])).train()
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "score/me')
    assert LocalTrainer(load_train_config(args)).train().ticks_trained == 4
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]


def test_a_checkpoint_without_a_config_record_resumes_with_a_warning_and_records_it(
    tmp_path, toy_data, small_model, capsys
):
    """A checkpoint written before runs recorded their config (no ``run_config`` in its state)."""
    out = tmp_path / "run"
    args = overrides(small_model, toy_data, out, "", "condition=method", "tracking.enabled=false")
    LocalTrainer(load_train_config([*args, "rl.ticks=2", "rl.read_at=2"])).train()
    path = out / "checkpoints" / "tick_000002" / "state.pt"
    state = torch.load(path, weights_only=False)
    state.pop("run_config", None)
    torch.save(state, path)
    capsys.readouterr()
    resumed = LocalTrainer(load_train_config(args))
    assert resumed.train().ticks_trained == 4
    err = capsys.readouterr().err
    assert f"warning: the run in {out} (checkpointed at tick 2) has no config record" in err
    assert "resuming it unchecked" in err
    latest = torch.load(out / "checkpoints" / "tick_000004" / "state.pt", weights_only=False)
    assert latest["run_config"] == resumed.run_config and latest["run_config"]["method.rank"] == 4


def test_a_kill_between_mlflow_transactions_never_loses_a_ticks_metrics(tmp_path, monkeypatch):
    """MLflow writes 1000 metrics a transaction: two pending ticks of 600 metrics each (the validation's
    last) are two transactions. Killed after the first, the resume must send the second tick again, whose
    sentinel (time/step_s) therefore comes after all its other metrics, not among the first 1000."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from commrl.rl.trainer import SENTINEL_METRIC

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.client(uri)
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    trainer = LocalTrainer.__new__(LocalTrainer)
    trainer.run_id, trainer.tracking_uri, trainer.out = run_id, uri, tmp_path
    trainer._resumed_from = 2  # both ticks in the checkpoint the resume starts from
    tick = {SENTINEL_METRIC: 1.0, **{f"m{i:03d}": float(i) for i in range(598)}, "val/acc": 0.5}
    trainer.pending = [(1, dict(tick)), (2, dict(tick))]
    real, calls = SqlAlchemyStore.log_batch, []

    def killed_after_one(self, run_id, metrics, params, tags):
        calls.append(len(metrics))
        if len(calls) > 1:
            raise KeyboardInterrupt  # the kill, between MLflow's two transactions
        return real(self, run_id, metrics, params, tags)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        trainer._send_pending()
    monkeypatch.setattr(SqlAlchemyStore, "log_batch", real)
    trainer._send_pending()  # the resume: the pending ticks come back from the checkpoint
    for key in (SENTINEL_METRIC, "val/acc", "m000"):
        assert sorted({m.step for m in client.get_metric_history(run_id, key)}) == [1, 2], key


def test_a_base_policy_rebuilt_in_place_refuses_the_resume(tmp_path, toy_data, small_model, capsys):
    """The base policy pretrained again under the same path (``pretrain.shipped`` dropped: a new base) is
    another input: a finished run would otherwise resume, train nothing and republish the old run."""
    base = tmp_path / "base"
    shutil.copytree(small_model, base)
    args = overrides(base, toy_data, tmp_path / "run", "", "condition=dense", "tracking.enabled=false")
    LocalTrainer(load_train_config(args)).train()
    assert Counting(load_train_config(args)).train().ticks_trained == 4  # the same base: nothing to do
    weights = load_file(base / "model.safetensors")
    save_file({k: v + 1e-3 for k, v in weights.items()}, base / "model.safetensors")
    capsys.readouterr()
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert "under another config" in err and "model.digest: '" in err
