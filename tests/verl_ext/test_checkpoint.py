"""After a run: ticks from verl's checkpoint tracker, HF folders by verl's own model merger, ``summary.json``
in the schema both drivers write, and what eval and a rerun read from it."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from commrl import tracking
from commrl.cli import verl_train
from commrl.cli.eval import read_point_checkpoint, read_summary
from commrl.compression import MethodConfig
from commrl.errors import ConfigError
from commrl.run import record
from commrl.run.summary import RunSummary
from commrl.verl_ext import config as vc
from commrl.verl_ext.checkpoint import TRACKER, latest_tick, summarize_run


@pytest.fixture(scope="module")
def two_ticks(cpu_verl, tiny_model_dir, tmp_path_factory):
    """Real verl FSDP2 checkpoints at ticks 1 and 2 (saved as RayPPOTrainer does) and the trained weights."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(vc.METHOD_ENV, vc.method_to_env(MethodConfig(rank=8, codec="lowrank", cadence=2)))
        worker = cpu_verl.build_worker(
            cpu_verl.actor_rollout_ref_config(tiny_model_dir, strategy="fsdp2"), "actor", "commrl"
        )
    batch = cpu_verl.training_batch(worker)
    checkpoints = tmp_path_factory.mktemp("verl") / "checkpoints"
    for tick in (1, 2):
        cpu_verl.run_ticks(worker, batch, 1, cpu_verl.BATCH)
        worker.save_checkpoint(str(checkpoints / f"global_step_{tick}" / "actor"), global_step=tick)
        (checkpoints / TRACKER).write_text(str(tick))
    return checkpoints, cpu_verl.full_params(cpu_verl.engine_of(worker))


def run_dir(two_ticks, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(two_ticks[0], out / "checkpoints")
    return out


def spec_of(ticks: int, read_at: int) -> vc.VerlRun:
    return dataclasses.replace(vc.compose_run("A", "no_projection", 0), ticks=ticks, read_at=read_at)


def test_summary_exports_final_and_read_point_and_flags_missing_ticks(two_ticks, tmp_path):
    """3 ticks asked, 2 trained, read at 1: ``final`` is tick 2, ``read`` the exported tick 1."""
    from transformers import AutoModelForCausalLM

    out = run_dir(two_ticks, tmp_path)
    assert latest_tick(out / "checkpoints") == 2
    summary = summarize_run(out, spec_of(3, 1), ticks_asked=3, mlflow_run_id=None)
    assert (summary.ticks_trained, summary.ticks_asked, summary.complete) == (2, 3, False)
    assert RunSummary.read(out) == summary  # one schema: what was written is what is read
    assert summary.read == str(out / "tick1") and summary.final == str(out / "final")
    final = AutoModelForCausalLM.from_pretrained(summary.final)
    for name, value in final.state_dict().items():
        torch.testing.assert_close(value, two_ticks[1][name].to(value.dtype), msg=name)
    early = AutoModelForCausalLM.from_pretrained(summary.read)
    assert not torch.equal(early.lm_head.weight, final.lm_head.weight)


def test_eval_evaluates_the_read_point_of_a_verl_run_not_its_last_tick(two_ticks, tmp_path):
    """Pair A's KL runs train past their read tick; ``commrl eval --summary`` must take ``tick<read_at>``."""
    out = run_dir(two_ticks, tmp_path)
    summarize_run(out, spec_of(2, 1), ticks_asked=2, mlflow_run_id=None)
    path = out / "summary.json"
    assert read_point_checkpoint(read_summary(path), path) == str(out / "tick1")


def test_a_rerun_of_a_finished_run_trains_nothing(two_ticks, tmp_path, monkeypatch):
    """verl's ``fit`` steps once after loading the last checkpoint; a complete run must not reach it (its
    last validation is in the run: test_resume_validation covers one a kill lost)."""
    out = run_dir(two_ticks, tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):  # train() sets them for verl: restored afterwards
        monkeypatch.setenv(name, "")

    def must_not_train(cfg):
        raise AssertionError("verl was started on a complete run")

    monkeypatch.setattr(verl_train, "run_verl", must_not_train)
    spec = spec_of(2, 2)
    run_id, _ = record.open_run(verl_train.identity(spec, 2), out, uri)  # the first attempt's run
    tracking.client(uri).log_metric(run_id, "val/acc", 0.5, step=2)
    cfg = vc.compose_verl_config(vc.run_overrides(spec, out, tmp_path / "data", tracking_uri=uri))
    assert verl_train.train(spec, cfg, out, uri, None, record.RunSpec()) == 0
    summary = RunSummary.read(out)
    assert (summary.ticks_trained, summary.complete, summary.read) == (2, True, str(out / "final"))
    run = tracking.client(uri).get_run(summary.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ticks"] == "2"


def test_a_resume_deletes_what_an_earlier_attempts_verl_would_have(two_ticks, tmp_path, monkeypatch, capsys):
    """Ticks 1 and 2 saved by an earlier process, k = 1: verl's manager in a new process would never delete
    tick 1's checkpoint; ``commrl verl-train`` does (read at 2, the newest), and says so."""
    from omegaconf import OmegaConf

    out = run_dir(two_ticks, tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):
        monkeypatch.setenv(name, "")
    monkeypatch.setattr(verl_train, "run_verl", lambda cfg: None)  # the run is complete: verl never starts
    spec = spec_of(2, 2)
    run_id, _ = record.open_run(verl_train.identity(spec, 2), out, uri)
    tracking.client(uri).log_metric(run_id, "val/acc", 0.5, step=2)
    cfg = vc.compose_verl_config(vc.run_overrides(spec, out, tmp_path / "data", tracking_uri=uri))
    OmegaConf.update(cfg, "trainer.max_actor_ckpt_to_keep", 1)
    assert verl_train.train(spec, cfg, out, uri, None, record.RunSpec()) == 0
    assert sorted(p.name for p in (out / "checkpoints").glob("global_step_*")) == ["global_step_2"]
    assert "deleted the checkpoints of ticks 1 under" in capsys.readouterr().err
    assert RunSummary.read(out).complete


def test_checkpoints_on_another_file_system_are_summarised(two_ticks, tmp_path, monkeypatch):
    """``trainer.default_local_dir`` given on the command line (a scratch file system): the summary counts and
    exports the checkpoints verl wrote there, not the missing ``DIR/checkpoints``."""
    out, scratch = tmp_path / "run", tmp_path / "scratch" / "ckpt"
    shutil.copytree(two_ticks[0], scratch)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):
        monkeypatch.setenv(name, "")
    monkeypatch.setattr(verl_train, "run_verl", lambda cfg: None)  # a complete run: nothing to train
    spec = spec_of(2, 1)
    overrides = [*vc.run_overrides(spec, out, tmp_path / "data", tracking_uri=uri)]
    cfg = vc.compose_verl_config([*overrides, f"trainer.default_local_dir={scratch}"])
    assert verl_train.train(spec, cfg, out, uri, None, record.RunSpec()) == 0
    summary = RunSummary.read(out)
    assert (summary.ticks_trained, summary.complete) == (2, True)
    assert summary.final == str(out / "final") and summary.read == str(out / "tick1")
    assert not (out / "checkpoints").exists()


def test_no_checkpoint_means_zero_ticks(tmp_path):
    summary = summarize_run(tmp_path, spec_of(100, 100), ticks_asked=100, mlflow_run_id=None)
    assert (summary.ticks_trained, summary.final, summary.read, summary.complete) == (0, None, None, False)
    assert RunSummary.read(tmp_path).ticks_asked == 100


def test_both_drivers_write_the_same_run_record(two_ticks, tiny_model_dir, tmp_path, monkeypatch):
    """One run of each driver into one MLflow store: the same identity tags (``record.RunIdentity``), the
    same ``summary.json`` keys, and read points that are absolute model folders. verl's side runs
    ``commrl verl-train``'s ``train`` on real verl checkpoints with verl's own training stubbed (no GPU)."""
    import json
    import subprocess
    import sys

    from commrl.rl.config import load_train_config
    from commrl.rl.trainer import LocalTrainer

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):
        monkeypatch.setenv(name, "")
    monkeypatch.setattr(verl_train, "run_verl", lambda cfg: None)
    verl_out = run_dir(two_ticks, tmp_path)
    spec = spec_of(2, 1)
    cfg = vc.compose_verl_config(vc.run_overrides(spec, verl_out, tmp_path / "data", tracking_uri=uri))
    assert verl_train.train(spec, cfg, verl_out, uri, None, record.RunSpec()) == 0

    data = tmp_path / "toy"
    prepare = [sys.executable, "-m", "commrl.cli.main", "prepare", "--dataset", "toy", "--out", str(data)]
    subprocess.run(prepare, check=True, capture_output=True)
    monkeypatch.chdir(tmp_path)
    local = load_train_config(
        [
            *(f"model.path={tiny_model_dir}", f"data.dir={data}", "out_dir=local/run", f"tracking.uri={uri}"),
            *("sampler.backend=hf", "rl.prompts_per_tick=2", "rl.group_size=2", "rl.mini_batches=1"),
            *("rl.micro_batch_size=4", "rl.ticks=2", "rl.read_at=1", "rl.val_every=1", "data.val_limit=2"),
            *("sampler.max_new_tokens=4", "threads=1", "condition=no_projection", "method.rank=4"),
        ]
    )
    LocalTrainer(local).train()
    local_out = tmp_path / "local" / "run"

    summaries = [json.loads((out / "summary.json").read_text()) for out in (verl_out, local_out)]
    assert summaries[0].keys() == summaries[1].keys()
    for summary in summaries:
        read = summary["read"]
        assert read is not None and read.endswith("tick1") and Path(read).is_absolute(), summary
        assert (Path(read) / "config.json").is_file()
    client = tracking.client(uri)
    tags = [client.get_run(s["mlflow_run_id"]).data.tags for s in summaries]
    identity = set(record.RunIdentity("A", "c", 0, "lowrank", "local", 2, 1).tags(record.RunSpec()))
    assert identity <= tags[0].keys() and identity <= tags[1].keys()
    assert [t["driver"] for t in tags] == ["verl", "local"] and {t["condition"] for t in tags} == {
        "no_projection"
    }


def test_a_resume_under_another_config_is_refused_and_a_longer_run_resumes(two_ticks, tmp_path, monkeypatch):
    """``DIR/run_config.json`` is written before verl's first step; a rerun under a changed method setting is
    refused before MLflow or verl are touched, naming the key; ``ticks`` and ``read_at`` extended resume."""
    out, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):
        monkeypatch.setenv(name, "")
    started = []

    def verl_trains_two_ticks(cfg):
        started.append(json.loads((out / "run_config.json").read_text()))
        shutil.copytree(two_ticks[0], out / "checkpoints")

    monkeypatch.setattr(verl_train, "run_verl", verl_trains_two_ticks)

    def train(spec: vc.VerlRun) -> int:
        cfg = vc.compose_verl_config(vc.run_overrides(spec, out, tmp_path / "data", tracking_uri=uri))
        return verl_train.train(spec, cfg, out, uri, None, record.RunSpec())

    assert train(spec_of(2, 2)) == 0 and started[0]["method.rank"] == 77 and started[0]["read_at"] == 2
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    changed = vc.compose_run("A", "no_projection", 0, ["method.rank=8", "ticks=2", "read_at=2"])
    with pytest.raises(ConfigError) as refused:
        train(changed)
    message = str(refused.value)
    assert f"{out} holds a run checkpointed at tick 2 under another config" in message
    assert "method.rank: 77 -> 8" in message and f"move or delete {out}" in message
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    assert tracking.client(uri).get_run(RunSummary.read(out).mlflow_run_id).info.status == "FINISHED"

    monkeypatch.setattr(verl_train, "run_verl", lambda cfg: started.append("resumed"))
    assert train(spec_of(4, 4)) == verl_train.EXIT_INCOMPLETE  # verl resumed (its training stubbed)
    assert started[-1] == "resumed"
    assert json.loads((out / "run_config.json").read_text())["verl.trainer.total_training_steps"] == 4


def test_a_model_or_data_rebuilt_in_place_refuses_the_resume(tiny_model_dir, tmp_path):
    """``run_config.json`` records what the model folder and verl's data files hold (``digest.*``): a resume
    after either was rebuilt under the same path is refused, naming it; unchanged, it resumes."""
    from commrl.verl_ext.checkpoint import record_run_config

    model, data, out = tmp_path / "model", tmp_path / "data", tmp_path / "run"
    shutil.copytree(tiny_model_dir, model)
    spec = vc.compose_run("A", "no_projection", 0, [f"model.path={model}"])
    train, val = vc.data_files(spec, data)
    for path in (train, val):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"rows of " + path.name.encode())
    cfg = vc.compose_verl_config(vc.run_overrides(spec, out, data))
    record_run_config(out, spec, cfg)
    recorded = json.loads((out / "run_config.json").read_text())
    assert {"digest.model", "digest.data"} <= recorded.keys()
    (out / "checkpoints" / "global_step_1" / "actor").mkdir(parents=True)
    (out / "checkpoints" / TRACKER).write_text("1")
    record_run_config(out, spec, cfg)  # the same model and data: resumes

    weights = next(model.glob("*.safetensors"))
    original = weights.read_bytes()
    weights.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # one bit of the base policy
    with pytest.raises(ConfigError, match=r"digest\.model: '[0-9a-f]{64}' -> '[0-9a-f]{64}'"):
        record_run_config(out, spec, cfg)
    weights.write_bytes(original)
    train.write_bytes(b"other rows")
    with pytest.raises(ConfigError, match=r"digest\.data") as refused:
        record_run_config(out, spec, cfg)
    assert "digest.model" not in str(refused.value)


def test_a_hub_models_cached_snapshot_is_its_folder(tmp_path, monkeypatch):
    """A hub id resolves to its snapshot in the Hugging Face cache (huggingface_hub's own lookup, on a cache
    laid out as it writes one); an uncached id, a remote path or a missing folder to none."""
    import huggingface_hub.constants

    snapshot = tmp_path / "hub" / "models--org--model" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--org--model" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--model" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert vc.local_model_folder("org/model") == snapshot
    assert vc.local_model_folder("org/other") is None
    assert vc.local_model_folder("hdfs://models/org/model") is None
    assert vc.local_model_folder(str(tmp_path / "missing")) is None
    assert vc.local_model_folder(str(snapshot)) == snapshot
