"""The local driver end to end on a small random policy: metrics, anchor cadence, MLflow, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rl_helpers import overrides

from commrl import tracking
from commrl.errors import ConfigError
from commrl.rl.config import load_train_config
from commrl.rl.trainer import LocalTrainer
from commrl.run.hooks import TrainCallbacks


def _history(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in tracking.client(uri).get_metric_history(run_id, key))


def test_bad_config_is_rejected_before_any_model_loads(tmp_path):
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "commrl.cli.main", "train", "rl.clip_ratio=1.5", f"out_dir={tmp_path}"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "rl.clip_ratio=1.5" in proc.stderr and "allowed" in proc.stderr
    assert not any(tmp_path.iterdir())
    assert time.perf_counter() - start < 60
    with pytest.raises(ConfigError, match=r"model\.path"):
        LocalTrainer(load_train_config([f"model.path={tmp_path / 'nope'}", f"out_dir={tmp_path}"])).train()


def test_dense_run_logs_one_value_per_tick_and_agrees_with_its_sampler(tmp_path, toy_data, small_model):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_train_config(overrides(small_model, toy_data, tmp_path / "run", uri, "condition=dense"))
    result = LocalTrainer(cfg).train()
    assert result.complete and result.ticks_trained == 4
    run = tracking.client(uri).get_run(result.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["condition"] == "dense" and run.data.tags["kind"] == "train"
    for key in (
        "score/mean",
        "actor/kl_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/pg_loss",
        "actor/grad_norm",
        "mismatch/logprob_corr",
        "mismatch/prob_gap",
        "comm/bytes_total",
        "comm/ratio_vs_dense",
        "time/step_s",
        "time/sample_s",
        "time/train_s",
        "health/alarm",
    ):
        assert _history(uri, result.mlflow_run_id, key) == [1, 2, 3, 4], key
    assert _history(uri, result.mlflow_run_id, "val/acc") == [0, 2, 4]
    metrics = run.data.metrics
    assert metrics["mismatch/logprob_corr"] > 0.9999  # same weights, same computation
    assert metrics["mismatch/prob_gap"] < 1e-4
    assert metrics["mismatch/async_clip_frac_eps0.2"] == 0.0
    assert metrics["comm/ratio_vs_dense"] == pytest.approx(1.0)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ticks_trained"] == summary["ticks_asked"] == 4
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def test_method_fires_the_anchor_on_cadence_and_compresses(tmp_path, toy_data, small_model):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_train_config(overrides(small_model, toy_data, tmp_path / "run", uri, "condition=method"))
    result = LocalTrainer(cfg).train()
    client = tracking.client(uri)
    fires = {m.step: m.value for m in client.get_metric_history(result.mlflow_run_id, "anchor/fire")}
    assert fires == {1: 1.0, 2: 0.0, 3: 1.0, 4: 0.0}  # ticks 0 and K = 2
    ratio = client.get_run(result.mlflow_run_id).data.metrics["comm/ratio_vs_dense"]
    assert ratio < 1.0
    corr = {m.step: m.value for m in client.get_metric_history(result.mlflow_run_id, "mismatch/logprob_corr")}
    assert min(corr.values()) < 0.999  # the trainer scores through rank-4 activations, the sampler does not


def test_sampler_codec_same_closes_the_gap(tmp_path, toy_data, small_model):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_train_config(
        overrides(
            small_model,
            toy_data,
            tmp_path / "run",
            uri,
            "condition=method_same_sampler",
            "rl.ticks=2",
            "rl.read_at=2",
        )
    )
    result = LocalTrainer(cfg).train()
    corr = tracking.client(uri).get_metric_history(result.mlflow_run_id, "mismatch/logprob_corr")
    assert min(m.value for m in corr) > 0.999


def _train_cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "commrl.cli.main", "train", *args]


def test_kill_then_rerun_resumes_with_exactly_one_value_per_tick(tmp_path, toy_data, small_model):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = overrides(
        small_model,
        toy_data,
        tmp_path / "run",
        uri,
        "condition=method",
        "rl.ticks=8",
        "rl.read_at=8",
        "checkpoint.every=2",
    )
    env = {**os.environ, "COMMRL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(_train_cmd(args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpts = tmp_path / "run" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and not (ckpts / "tick_000004").is_dir():
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (ckpts / "tick_000004").is_dir(), "the run never reached its second checkpoint"
    assert not (tmp_path / "run" / "summary.json").exists()
    rerun = subprocess.run(_train_cmd(args), env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    run_id = json.loads((tmp_path / "run" / "summary.json").read_text())["mlflow_run_id"]
    assert (tmp_path / "run" / "mlflow_run_id").read_text().strip() == run_id
    for key in ("score/mean", "actor/kl_loss", "comm/bytes_cumulative", "time/step_s", "anchor/fire"):
        assert _history(uri, run_id, key) == list(range(1, 9)), key
    assert _history(uri, run_id, "val/acc") == [0, 2, 4, 6, 8]

    straight = tmp_path / "straight"
    args2 = [a if not a.startswith("out_dir=") else f"out_dir={straight}" for a in args]
    args2 = [a if not a.startswith("tracking.uri=") else "tracking.enabled=false" for a in args2]
    assert subprocess.run(_train_cmd(args2), env=env, capture_output=True).returncode == 0
    from safetensors.torch import load_file

    resumed = load_file(tmp_path / "run" / "final" / "model.safetensors")
    uninterrupted = load_file(straight / "final" / "model.safetensors")
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


@pytest.mark.parametrize("condition", ["dense", "method"])
def test_first_mini_batch_reuses_its_training_forward_as_old_log_probs(
    tmp_path, toy_data, small_model, condition
):
    """The reuse skips one old-log-prob pass per micro-batch of the first mini-batch and changes nothing."""

    class Recorder(TrainCallbacks):
        def __init__(self) -> None:
            self.ticks: list[dict[str, float]] = []

        def on_tick(self, step: int, metrics: dict[str, float]) -> None:
            self.ticks.append(metrics)

    class Counting(LocalTrainer):
        """Counts every forward of the trained policy; ``reuse=False`` turns the reuse off."""

        def __init__(self, cfg, reuse: bool, **kwargs) -> None:
            super().__init__(cfg, **kwargs)
            self.reuse, self.forwards = reuse, 0

        def _setup(self) -> None:
            super()._setup()
            self.forward_is_deterministic &= self.reuse
            self.model.register_forward_pre_hook(lambda *_: setattr(self, "forwards", self.forwards + 1))

    runs = {}
    for name, reuse in (("reuse", True), ("separate", False)):
        extra = (f"condition={condition}", "method.cadence=100", "tracking.enabled=false")
        cfg = load_train_config(
            [*overrides(small_model, toy_data, tmp_path / name, "", *extra), "rl.ticks=3", "rl.read_at=3"]
        )
        recorder = Recorder()
        trainer = Counting(cfg, reuse, callbacks=recorder)
        trainer.train()
        runs[name] = (recorder.ticks, trainer.forwards, trainer.model.state_dict())
    (reuse, n_reuse, w_reuse), (separate, n_separate, w_separate) = runs["reuse"], runs["separate"]
    fast_ticks = 3 if condition == "dense" else 2  # the method's anchor fires at tick 0 (no fast update)
    assert n_separate - n_reuse == fast_ticks * 2  # 2 micro-batches of 4 rows in the first mini-batch of 8
    for a, b in zip(reuse, separate, strict=True):
        for key in ("actor/kl_loss", "actor/pg_loss", "actor/ppo_kl", "mismatch/logprob_corr", "score/mean"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
    for key, value in w_reuse.items():
        assert torch.allclose(value, w_separate[key], atol=1e-5), key


def test_fire_metrics_are_logged_and_fast_step_false_moves_the_weights_on_fires_only(
    tmp_path, toy_data, small_model
):
    """The controller's fire-tick metrics (projection distance, basis overlap, gradient cosines, energy
    captured) reach the log; anchor_only (method.fast_step=false): the fast tick takes no AdamW step."""

    class Recording(LocalTrainer):
        def __init__(self, cfg) -> None:
            super().__init__(cfg)
            self.ticks: list[tuple[dict[str, float], bool]] = []

        def _tick(self, tick: int) -> dict[str, float]:
            before = {k: v.clone() for k, v in self.model.state_dict().items()}
            metrics = super()._tick(tick)
            moved = any(not torch.equal(v, before[k]) for k, v in self.model.state_dict().items())
            self.ticks.append((metrics, moved))
            return metrics

    # anchor_only = method.fast_step=false; the random policy scores 0 (zero advantages), so weight decay
    # is what makes an AdamW step visible in the weights
    extra = (
        "condition=anchor_only",
        "tracking.enabled=false",
        "rl.weight_decay=0.1",
        "method.grad_cosine_every=1",
    )
    cfg = load_train_config(
        [*overrides(small_model, toy_data, tmp_path / "run", "", *extra), "rl.ticks=3", "rl.read_at=3"]
    )
    trainer = Recording(cfg)
    trainer.train()
    assert [moved for _, moved in trainer.ticks] == [True, False, True]  # fire, fast, fire (K = 2)
    assert {int(s["step"]) for s in trainer.optimizer.state.values()} == {2}
    fires = [trainer.ticks[0][0], trainer.ticks[2][0]]
    for metrics in fires:
        for key in (
            "anchor/projection_distance",
            "anchor/basis_overlap",
            "anchor/visible_snapshots",
            "anchor/grad_cosine_raw",
            "anchor/grad_cosine_corrected",
            "codec/energy_captured",
            "codec/energy_captured/layer0",
            "codec/energy_captured/layer1",
        ):
            assert key in metrics, key
        assert -1 <= metrics["anchor/grad_cosine_raw"] <= 1 and 0 < metrics["codec/energy_captured"] <= 1
    assert fires[1]["anchor/visible_snapshots"] == 1.0  # h = K: the tick-0 snapshot
    assert "anchor/projection_distance" not in trainer.ticks[1][0]  # a fast tick
    with open(tmp_path / "run" / "metrics.jsonl") as fh:
        table = {row["step"]: row for row in map(json.loads, fh)}
    assert table[1]["anchor/projection_distance"] == fires[0]["anchor/projection_distance"]
    assert table[3]["anchor/basis_overlap"] == fires[1]["anchor/basis_overlap"]


def test_cosine_diagnostic_on_fewer_fires_changes_only_the_cosines(tmp_path, toy_data, small_model):
    """method.grad_cosine_every = 4 at K = 2 (fires 0, 2, 4): the codec replay runs at ticks 0 and 4 only, one
    forward+backward pass fewer, and every other logged value and the final weights equal those of the run
    that measures every fire (the tiny pair measures every 10 ticks: README "Numbers")."""
    from safetensors.torch import load_file

    class Counting(LocalTrainer):
        def _setup(self) -> None:
            super()._setup()
            self.forwards = 0
            self.model.register_forward_pre_hook(lambda *_: setattr(self, "forwards", self.forwards + 1))

    runs = {}
    for every in (1, 4):
        out = tmp_path / f"every{every}"
        extra = ("condition=method", "tracking.enabled=false", f"method.grad_cosine_every={every}")
        cfg = load_train_config(
            [*overrides(small_model, toy_data, out, "", *extra), "rl.ticks=5", "rl.read_at=5"]
        )
        trainer = Counting(cfg)
        trainer.train()
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        runs[every] = (trainer.forwards, rows, load_file(out / "final" / "model.safetensors"))
    (n_all, all_rows, w_all), (n_few, few_rows, w_few) = runs[1], runs[4]
    assert n_all - n_few == 4  # tick 2's codec replay: the whole batch of 16 rows, 4 micro-batches
    cosine = "anchor/grad_cosine_raw"
    assert [r["step"] for r in all_rows if cosine in r] == [1, 3, 5]  # a tick's metrics log at step tick + 1
    assert [r["step"] for r in few_rows if cosine in r] == [1, 5]

    def rest(rows: list[dict]) -> list[dict]:
        return [
            {k: v for k, v in r.items() if not k.startswith(("time/", "anchor/grad_cosine"))} for r in rows
        ]

    assert rest(all_rows) == rest(few_rows)
    assert all(torch.equal(w_all[k], w_few[k]) for k in w_all)


def test_anchor_off_scores_tick_0_old_and_reference_log_probs_with_the_calibrated_basis(
    tmp_path, toy_data, small_model
):
    class Recording(LocalTrainer):
        def _setup(self) -> None:
            super()._setup()
            self.initial = [Q.clone() for Q in self.ctrl.codec.bases]
            self.seen: list[tuple[bool, list[torch.Tensor]]] = []

        def _log_probs(self, model, batch, mode: str, start: int = 0) -> torch.Tensor:
            if mode == "compressed":
                self.seen.append((model is self.ref, [Q.clone() for Q in self.ctrl.codec.bases]))
            return super()._log_probs(model, batch, mode, start)

    extra = ("condition=anchor_off", "tracking.enabled=false")
    cfg = load_train_config(
        [*overrides(small_model, toy_data, tmp_path / "run", "", *extra), "rl.ticks=1", "rl.read_at=1"]
    )
    trainer = Recording(cfg)
    trainer.train()
    calibrated = trainer.ctrl.codec.bases
    assert [is_ref for is_ref, _ in trainer.seen] == [False, True]  # tick 0's old and reference passes
    for _, bases in trainer.seen:
        assert all(torch.equal(a, b) for a, b in zip(bases, calibrated, strict=True))
        assert not any(torch.equal(a, b) for a, b in zip(bases, trainer.initial, strict=True))


def test_the_same_seed_and_threads_give_the_same_numbers(tmp_path, toy_data, small_model):
    """Reproducibility as the README states it: one machine, seed and thread count -> identical metrics
    (every logged value but wall times) and weights; another seed -> other numbers."""

    def run(name: str, seed: int) -> tuple[list[dict], dict]:
        out = tmp_path / name
        args = overrides(small_model, toy_data, out, "unused", "condition=method", f"seed={seed}")
        cfg = load_train_config(
            [a for a in args if not a.startswith("tracking.uri=")] + ["tracking.enabled=false"]
        )
        LocalTrainer(cfg).train()
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        from safetensors.torch import load_file

        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows], load_file(
            out / "final" / "model.safetensors"
        )

    (first, w1), (again, w2), (other, _) = run("a", 0), run("b", 0), run("c", 1)
    assert first == again
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert first != other


def test_pg_loss_is_the_mini_batch_loss_whatever_the_micro_batch_size(tmp_path, toy_data):
    """Each micro-batch's loss is its share of the mini-batch's (verl's global token-mean), so the logged
    ``actor/pg_loss`` sums them per mini-batch, as verl does (``AggregationType.SUM``): micro-batches of 4
    and of 8 (a whole mini-batch) log the same value, on fire and fast ticks. The shipped base policy, which
    earns rewards (a random one earns none: every advantage, and the loss, would be 0)."""
    base = Path(__file__).resolve().parents[2] / "assets" / "tiny-base"
    logged = {}
    for micro in (4, 8):
        out = tmp_path / f"micro{micro}"
        extra = ("condition=method", "tracking.enabled=false", f"rl.micro_batch_size={micro}")
        budget = ("sampler.max_new_tokens=24", "rl.ticks=2", "rl.read_at=2")  # room for \\boxed{123}
        cfg = load_train_config([*overrides(base, toy_data, out, "", *extra), *budget])
        LocalTrainer(cfg).train()
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        logged[micro] = [r["actor/pg_loss"] for r in rows if "actor/pg_loss" in r]
    assert len(logged[4]) == 2 and abs(logged[8][1]) > 1e-3  # the fire at 0 (a ratio-one replay: ~0), tick 1
    assert logged[4] == pytest.approx(logged[8], rel=1e-4, abs=1e-8)


def test_a_kill_after_the_last_checkpoint_before_its_flush_loses_no_tick(tmp_path, toy_data, small_model):
    """The last checkpoint holds the ticks it has not yet written (it is saved, then flushed): a rerun after a
    kill between the two restores it, trains nothing and still writes them. Here MLflow got them and the
    metrics table did not (a kill between their writes): the table gets its rows, MLflow no second value."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "run"
    cfg = load_train_config(overrides(small_model, toy_data, out, uri, "condition=dense"))
    first = LocalTrainer(cfg).train()
    table = out / "metrics.jsonl"
    rows = table.read_text().splitlines()
    table.write_text("".join(line + "\n" for line in rows if json.loads(line)["step"] <= 2))
    for done in (out / "summary.json", out / "final"):
        subprocess.run(["rm", "-rf", str(done)], check=True)
    again = LocalTrainer(cfg).train()
    assert again.mlflow_run_id == first.mlflow_run_id and again.ticks_trained == 4
    assert table.read_text().splitlines() == rows
    history = tracking.client(uri).get_metric_history(first.mlflow_run_id, "score/mean")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]


def test_an_error_mid_run_marks_the_mlflow_run_failed_and_paths_are_absolute(
    tmp_path, toy_data, small_model, monkeypatch
):
    """Any exception (not only a non-finite loss) ends the MLflow run FAILED with the error, the ticks done
    before it logged; a run started from another directory with a relative out_dir writes absolute paths."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    cfg = load_train_config(overrides(small_model, toy_data, "rel/run", uri, "condition=dense"))

    class Failing(LocalTrainer):
        def _tick(self, tick):
            if tick == 2:
                raise RuntimeError("disk full")
            return super()._tick(tick)

    trainer = Failing(cfg)
    with pytest.raises(RuntimeError, match="disk full"):
        trainer.train()
    run = tracking.client(uri).get_run(trainer.run_id)
    assert run.info.status == "FAILED" and run.data.tags["failure"] == "RuntimeError('disk full')"
    assert _history(uri, trainer.run_id, "score/mean") == [1, 2]
    summary = LocalTrainer(cfg).train()  # resumes from tick 2's checkpoint into the same run
    assert summary.mlflow_run_id == trainer.run_id
    monkeypatch.chdir(tmp_path.parent)
    assert Path(summary.final).is_absolute() and Path(summary.final, "config.json").is_file()
    assert summary.read == summary.final


def test_a_retry_after_a_crash_past_the_last_checkpoint_logs_its_own_ticks(tmp_path, toy_data, small_model):
    """A crash after tick 3 (the last checkpoint at 2) flushes tick 3 as that attempt computed it; the retry
    resumes at 2 and trains tick 3 again. On another CPU, thread count or sampler the retry's tick 3 is not
    the crashed one's (here marked by hand): the table holds the retry's, MLflow's newest value is it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "run"
    cfg = load_train_config(overrides(small_model, toy_data, out, uri, "condition=dense"))

    class Crashing(LocalTrainer):
        def _tick(self, tick):
            if tick == 3:
                raise RuntimeError("node lost")
            metrics = super()._tick(tick)
            return metrics | {"score/mean": 100.0} if tick == 2 else metrics

    crashed = Crashing(cfg)
    with pytest.raises(RuntimeError, match="node lost"):
        crashed.train()
    table = out / "metrics.jsonl"
    before = {r["step"]: r for r in map(json.loads, table.read_text().splitlines())}
    assert sorted(before) == [0, 1, 2, 3] and before[3]["score/mean"] == 100.0
    LocalTrainer(cfg).train()
    rows = {r["step"]: r for r in map(json.loads, table.read_text().splitlines())}
    assert sorted(rows) == [0, 1, 2, 3, 4] and rows[3]["score/mean"] != 100.0
    history = tracking.client(uri).get_metric_history(crashed.run_id, "score/mean")
    at_3 = sorted((m for m in history if m.step == 3), key=lambda m: m.timestamp)
    assert at_3[0].value == 100.0 and at_3[-1].value == rows[3]["score/mean"]


def test_a_failure_writing_the_final_model_ends_the_mlflow_run_failed(tmp_path, toy_data, small_model):
    """After the last tick the final model is exported (a full disk can fail it): the MLflow run ends
    FAILED with the error, not RUNNING; a rerun trains nothing more and finishes it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_train_config(overrides(small_model, toy_data, tmp_path / "run", uri, "condition=dense"))

    class DiskFull(LocalTrainer):
        def _save_hf(self, target):
            if target.name == "final":
                raise OSError(28, "No space left on device")
            return super()._save_hf(target)

    trainer = DiskFull(cfg)
    with pytest.raises(OSError, match="No space left"):
        trainer.train()
    run = tracking.client(uri).get_run(trainer.run_id)
    assert run.info.status == "FAILED" and "No space left on device" in run.data.tags["failure"]
    summary = LocalTrainer(cfg).train()
    assert summary.mlflow_run_id == trainer.run_id and summary.ticks_trained == 4
    assert tracking.client(uri).get_run(trainer.run_id).info.status == "FINISHED"


def test_val_acc_reads_the_weights_without_the_samplers_codec(tmp_path, toy_data):
    """``sampler.codec: same``: ``val/acc`` is the live weights' greedy accuracy as in every condition (at
    tick 0 the base model's, equal to the method's), and ``val/acc_sampler_codec`` the same through the
    sampler's codec (the shipped base policy: it answers; through a rank-4 codec it does not)."""
    base = Path(__file__).resolve().parents[2] / "assets" / "tiny-base"
    rows = {}
    for condition in ("method", "method_same_sampler"):
        out = tmp_path / condition
        extra = (f"condition={condition}", "tracking.enabled=false", "sampler.max_new_tokens=24")
        cfg = load_train_config([*overrides(base, toy_data, out, "", *extra), "rl.ticks=2", "rl.read_at=2"])
        LocalTrainer(cfg).train()
        rows[condition] = {
            r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        }
    plain, same = rows["method"], rows["method_same_sampler"]
    assert same[0]["val/acc"] == plain[0]["val/acc"] > 0.2  # the base model, as method.md reads tick 0
    assert "val/acc_sampler_codec" not in plain[0]
    assert [s for s in same if "val/acc_sampler_codec" in same[s]] == [0, 2]
    assert same[0]["val/acc_sampler_codec"] < same[0]["val/acc"]
