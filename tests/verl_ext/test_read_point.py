"""The verl driver rejects a read point it cannot produce (val/acc is logged and the read model saved only
every trainer.test_freq / trainer.save_freq ticks and at the last tick); every shipped run still passes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from commrl import config_tree
from commrl.cli.main import main
from commrl.errors import ConfigError
from commrl.verl_ext import config as vc

REPO = Path(__file__).resolve().parents[2]


def checked(pair: str, condition: str, commrl=(), verl=()):
    """``commrl verl-train --dry-run``'s checks of the run: compose, then ``check_verl_config``."""
    spec = vc.compose_run(pair, condition, 0, commrl)
    overrides = vc.run_overrides(
        spec, Path("/runs/x"), Path("/data"), tracking_uri="sqlite:///m.db", extra=verl
    )
    cfg = vc.compose_verl_config(overrides)
    vc.check_verl_config(cfg, spec)
    return spec, cfg


@pytest.mark.parametrize(
    ("pair", "commrl", "verl", "message"),
    [
        ("B", ["ticks=40"], [], "read_at=50 is invalid: the run trains ticks=40"),
        ("A", ["ticks=120", "read_at=130"], [], "read_at=130 is invalid: the run trains ticks=120"),
        ("A", ["read_at=60"], [], "read_at=60 is invalid with val_every (verl's trainer.test_freq)=25"),
        ("A", ["val_every=30"], [], "read_at=100 is invalid with val_every (verl's trainer.test_freq)=30"),
        (
            "A",
            [],
            ["trainer.test_freq=0"],
            "read_at=100 is invalid with val_every (verl's trainer.test_freq)=0",
        ),
        ("A", [], ["trainer.save_freq=40"], "read_at=100 is invalid with trainer.save_freq=40"),
        ("A", [], ["trainer.save_freq=-1"], "read_at=100 is invalid with trainer.save_freq=-1"),
        (
            "A",
            [],
            ["trainer.total_training_steps=80"],
            "read_at=100 is invalid: verl trains trainer.total_training_steps=80 ticks",
        ),
    ],
)
def test_a_read_point_verl_cannot_produce_is_rejected(pair, commrl, verl, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)) as err:
        checked(pair, "dense", commrl, verl)
    assert "set " in str(err.value)  # the fix is named


def test_the_read_point_may_be_the_last_tick_off_the_cadence():
    """verl validates and saves the last tick whatever the cadence."""
    spec, cfg = checked("A", "dense", ["ticks=90", "read_at=90"])
    assert (spec.read_at, cfg.trainer.test_freq, cfg.trainer.save_freq) == (90, 25, 25)


def test_the_gpu_smokes_verl_side_cadence_passes():
    """scripts/gpu_smoke.sh sets verl's own trainer.* (4 ticks, test/save every 2) and read_at=2."""
    smoke = ["trainer.total_training_steps=4", "trainer.test_freq=2", "trainer.save_freq=2"]
    checked("A", "method", ["read_at=2"], smoke)
    with pytest.raises(ConfigError, match="read_at=3 is invalid"):
        checked("A", "method", ["read_at=3"], smoke)


def test_verl_train_exits_2_naming_the_read_point(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COMMRL_RESULTS", str(tmp_path))
    argv = ["verl-train", "--pair", "A", "--condition", "dense", "--out", str(tmp_path), "--dry-run"]
    assert main([*argv, "read_at=60"]) == 2
    assert "read_at=60 is invalid" in capsys.readouterr().err


def shipped_runs() -> list[tuple[str, str, tuple[str, ...]]]:
    """(pair, condition, commrl overrides) of every run the shipped configs start: each condition the verl
    driver runs on both pairs (the pair's ticks_by_condition), configs/pipeline/paper.yaml's runs with
    their ticks, and the verl sweeps' trials (configs/sweep/paper_*.yaml)."""
    runs = [
        (pair, condition, ())
        for pair in ("A", "B")
        for condition in config_tree.known_conditions(REPO / "configs" / "verl", "verl")
    ]
    paper = yaml.safe_load((REPO / "configs" / "pipeline" / "paper.yaml").read_text())
    for pair, spec in paper["pairs"].items():
        for condition in spec["conditions"]:
            ticks = (spec.get("ticks") or {}).get(condition)
            runs.append((pair, condition, (f"ticks={ticks}",) if ticks else ()))
    for path in sorted((REPO / "configs" / "sweep").glob("paper_*.yaml")):
        sweep = yaml.safe_load(path.read_text())
        assert sweep["driver"] == "verl", path
        keys = ("ticks", "read_at", "val_every")
        runs.append((sweep["pair"], sweep["condition"], tuple(f"{k}={sweep[k]}" for k in keys)))
    return runs


def test_every_shipped_run_passes_the_read_point_checks():
    runs = shipped_runs()
    assert {(p, c) for p, c, _ in runs} >= {("A", "method"), ("B", "dropout"), ("A", "dense")}
    for pair, condition, commrl in runs:
        spec, cfg = checked(pair, condition, commrl)
        assert spec.read_at <= spec.ticks == cfg.trainer.total_training_steps, (pair, condition, commrl)


@pytest.mark.parametrize(
    ("pair", "commrl", "keep"),
    [
        ("A", ["ticks=150"], 3),  # saves at 100, 125, 150: the read point and the two after it
        ("A", ["ticks=100"], 1),  # read at the last tick, 100
        ("B", [], 2),  # 75 ticks read at 50: 50 and 75
        ("A", ["ticks=110"], 2),  # the last tick saves off the cadence: 100 and 110
    ],
)
def test_verl_keeps_the_fewest_checkpoints_that_keep_the_read_point(tmp_path, pair, commrl, keep):
    """Unset, verl keeps every checkpoint (~45 GB each for pair A); commrl sets the fewest that leave the
    read point's for the export, and a smaller value of one's own is refused, naming the saves after it."""
    _, cfg = vc.compose_verl_run(pair, "dense", 0, commrl, tmp_path / "run", tmp_path / "data")
    assert cfg.trainer.max_actor_ckpt_to_keep == keep
    assert (
        vc.compose_verl_run(
            pair,
            "dense",
            0,
            [*commrl, "trainer.max_actor_ckpt_to_keep=9"],
            tmp_path / "run",
            tmp_path / "data",
        )[1].trainer.max_actor_ckpt_to_keep
        == 9
    )
    checked(pair, "dense", commrl, ["trainer.max_actor_ckpt_to_keep=0"])  # verl keeps every one
    if keep > 1:
        with pytest.raises(
            ConfigError, match=rf"max_actor_ckpt_to_keep={keep - 1} would delete .* at least {keep}"
        ):
            checked(pair, "dense", commrl, [f"trainer.max_actor_ckpt_to_keep={keep - 1}"])


@pytest.mark.parametrize(("keep", "left"), [(3, [100, 125, 150]), (0, [25, 50, 75, 100, 125, 150])])
def test_verls_checkpoint_manager_deletes_all_but_the_kept_newest(tmp_path, keep, left):
    """The rule ``checkpoints_to_keep`` relies on, in verl's own manager: after saves at 25 .. 150 with
    k = 3, the checkpoints of 100, 125 and 150 are left; with k = 0 every one (so 0 is not refused)."""
    from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

    manager = BaseCheckpointManager.__new__(BaseCheckpointManager)
    manager.previous_saved_paths = []
    for step in range(25, 151, 25):
        path = tmp_path / f"global_step_{step}" / "actor"
        manager.ensure_checkpoint_capacity(keep)
        path.mkdir(parents=True)
        manager.register_checkpoint(str(path), keep)
    assert sorted(int(p.parent.name.split("_")[-1]) for p in tmp_path.glob("global_step_*/actor")) == left


def test_resumed_attempts_leave_no_more_checkpoints_than_verls_count(tmp_path):
    """Pair A, 150 ticks read at 100, k = 3, preempted after tick 110 and again after 120: each attempt is a
    fresh process and a fresh verl manager, which deletes only its own saves, so 75 and 110 would stay on
    disk for good. ``prune_checkpoints`` at each attempt's start and end (``commrl verl-train``) leaves the
    read point and the three newest; k = 0 (verl keeps all) deletes none, nor a save cut off past the
    tracker."""
    from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

    from commrl.verl_ext.checkpoint import TRACKER, prune_checkpoints

    def on_disk() -> list[int]:
        return sorted(int(p.parent.name.split("_")[-1]) for p in tmp_path.glob("global_step_*/actor"))

    def attempt(saves: list[int], prune: bool) -> None:
        if prune:
            prune_checkpoints(tmp_path, 3, 100)
        manager = BaseCheckpointManager.__new__(BaseCheckpointManager)
        manager.previous_saved_paths = []
        for step in saves:
            manager.ensure_checkpoint_capacity(3)
            (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
            manager.register_checkpoint(str(tmp_path / f"global_step_{step}" / "actor"), 3)
            (tmp_path / TRACKER).write_text(str(step))
        if prune:
            prune_checkpoints(tmp_path, 3, 100)

    attempts = [[25, 50, 75, 100, 110], [120], [125, 150]]
    for saves in attempts:
        attempt(saves, prune=False)
    assert on_disk() == [75, 100, 110, 120, 125, 150]
    for folder in tmp_path.iterdir():
        shutil.rmtree(folder) if folder.is_dir() else folder.unlink()
    for saves in attempts:
        attempt(saves, prune=True)
    assert on_disk() == [100, 120, 125, 150]

    (tmp_path / "global_step_175" / "actor").mkdir(parents=True)  # cut off before verl wrote the tracker
    assert prune_checkpoints(tmp_path, 0, 100) == [] and on_disk() == [100, 120, 125, 150, 175]
    assert prune_checkpoints(tmp_path, 1, 100) == [120, 125] and on_disk() == [100, 150, 175]


def test_ray_gets_the_cpus_of_the_slurm_job_step(tmp_path, monkeypatch):
    """Inside a Slurm job verl's unset ``ray_kwargs.ray_init.num_cpus`` becomes the CPUs the step's cpuset
    allows (Ray itself would count the node's); outside Slurm, or set by hand, it is left alone."""
    _, cfg = vc.compose_verl_run("A", "dense", 0, [], tmp_path / "run", tmp_path / "data")
    assert cfg.ray_kwargs.ray_init.num_cpus is None
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert vc.slurm_ray_cpus(cfg) is None and cfg.ray_kwargs.ray_init.num_cpus is None
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(64)))
    assert vc.slurm_ray_cpus(cfg) == 64 and cfg.ray_kwargs.ray_init.num_cpus == 64
    _, mine = vc.compose_verl_run(
        "A", "dense", 0, ["ray_kwargs.ray_init.num_cpus=16"], tmp_path / "run", tmp_path / "data"
    )
    assert vc.slurm_ray_cpus(mine) is None and mine.ray_kwargs.ray_init.num_cpus == 16


def test_a_model_verls_workers_cannot_load_is_refused_before_ray_starts(tmp_path, monkeypatch):
    """A missing local folder, or a hub id with HF_HUB_OFFLINE set and no cached copy (this machine has
    none), is a ConfigError naming the pair file's model.path; a local folder, or the hub online, passes."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    vc.check_model_source(str(tmp_path), "A")
    vc.check_model_source("Qwen/Qwen2.5-Math-1.5B", "A")  # online: verl downloads it
    with pytest.raises(
        ConfigError, match=r"'/nowhere/qwen' is not a folder; point model.path in configs/verl"
    ):
        vc.check_model_source("/nowhere/qwen", "A")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"HF_HUB_OFFLINE is set .* no cached copy") as err:
        vc.check_model_source("Qwen/Qwen2.5-Math-1.5B", "B")
    assert "configs/verl/pair/B.yaml" in str(err.value) and "huggingface-cli download" in str(err.value)


def test_a_remote_path_passes_and_a_name_neither_folder_nor_hub_id_is_refused(monkeypatch):
    """verl copies an ``hdfs://`` model itself, so it is not checked here; a relative path of several parts
    or a name the hub would reject is a ConfigError naming model.path, not huggingface_hub's own error."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    vc.check_model_source("hdfs://cluster/models/qwen", "A")
    with pytest.raises(ConfigError, match=r"'models/qwen/1.5b' is not a folder; point model.path"):
        vc.check_model_source("models/qwen/1.5b", "A")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(ConfigError, match=r"'qwen math--1.5b' is not a folder.*nor a Hugging Face hub id"):
        vc.check_model_source("qwen math--1.5b", "A")
