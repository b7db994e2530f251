"""What one trial trains: its folder and its training command (Hydra overrides or ``commrl verl-train``).

A trial is one training run of ``(pair, condition, seed)`` with the suggested knobs as overrides. Its
folder is keyed by the *original* trial number, so a retry of a killed trial reuses the killed trial's
checkpoints and MLflow run and resumes where it stopped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from commrl import tracking
from commrl.errors import ConfigError
from commrl.run.record import RunSpec
from commrl.sweep.config import SweepConfig
from commrl.sweep.space import point_overrides


def trials_dir(cfg: SweepConfig, study: str) -> Path:
    """``<results>/sweeps/<pair>/<study>/trials`` (``$COMMRL_RESULTS`` or ``./results``)."""
    return tracking.results_dir() / "sweeps" / cfg.pair / study / "trials"


def trial_dir(cfg: SweepConfig, study: str, key: int) -> Path:
    return trials_dir(cfg, study) / f"trial{key:04d}"


def trial_seed(cfg: SweepConfig, params: Mapping[str, Any]) -> int:
    """The training seed of a trial: its grid point's ``seed``, else the config's."""
    return params.get("seed", cfg.seed)


def local_overrides(cfg: SweepConfig, params: Mapping[str, Any], out_dir: Path | str) -> list[str]:
    """Hydra overrides of ``configs/train/`` for one trial of the local driver."""
    return [
        f"pair={cfg.pair}",
        f"condition={cfg.condition}",
        f"seed={trial_seed(cfg, params)}",
        f"out_dir={out_dir}",
        f"rl.ticks={cfg.ticks}",
        f"rl.val_every={cfg.val_every}",
        f"rl.read_at={cfg.read_at}",
        *point_overrides(params, "local"),
        *cfg.train_overrides,
    ]


def verl_command(
    cfg: SweepConfig, params: Mapping[str, Any], out_dir: Path | str, run: RunSpec | None = None
) -> list[str]:
    """``commrl verl-train`` of one trial (keys ticks/read_at/val_every/method.* go to configs/verl/); ``run``
    places its MLflow run (kind ``trial``, nested under the sweep, the trial's tags) from its creation.
    ``ticks=`` wins over the pair's ``ticks_by_condition`` (pair A trains some conditions 150 ticks).
    """
    return [
        sys.executable,
        "-m",
        "commrl.cli.main",
        "verl-train",
        "--pair",
        cfg.pair,
        "--condition",
        cfg.condition,
        "--seed",
        str(trial_seed(cfg, params)),
        "--out",
        str(out_dir),
        *(["--run-spec", run.to_json()] if run is not None else []),
        *verl_overrides(cfg, params),
    ]


def verl_overrides(cfg: SweepConfig, params: Mapping[str, Any]) -> list[str]:
    """The ``key=value`` arguments of ``commrl verl-train`` for one trial."""
    return [
        f"ticks={cfg.ticks}",
        f"read_at={cfg.read_at}",
        f"val_every={cfg.val_every}",
        *point_overrides(params, "verl"),
        *cfg.train_overrides,
    ]


def reference_point(cfg: SweepConfig) -> dict[str, Any]:
    """The point ``trial_config`` composes at when a study has none yet: its defaults, else the space's first
    check point (a grid's: the first value of each axis)."""
    return next(iter(_check_points(cfg).values()))


def trial_config(cfg: SweepConfig, point: dict[str, Any]) -> dict[str, Any]:
    """What a trial computes with, at the study's reference ``point``, recorded as a run records its own
    (``commrl.run.fingerprint.of``): the composed config of the pair and condition files. A study keeps it
    and its point, so that a changed file refuses to add trials trained under it to the old ones
    (``study.check_trial_config``), and a grid that gains values keeps comparing at the same point."""
    from commrl.run import fingerprint

    unused = Path("trial-config")  # the trial's folder: exempt from the record
    # without digests: the model's and data's contents are each trial's own check (its run records them); a
    # study may be created before the base policy is built
    if cfg.driver == "verl":
        from commrl.verl_ext import config as vc
        from commrl.verl_ext.checkpoint import resolved_config

        run, verl_cfg = vc.compose_verl_run(
            cfg.pair,
            cfg.condition,
            trial_seed(cfg, point),
            verl_overrides(cfg, point),
            unused,
            (tracking.results_dir() / "data").resolve(),
        )
        return fingerprint.of(resolved_config(run, verl_cfg, digests=False))
    from commrl.rl.config import load_train_config

    return fingerprint.of(load_train_config(local_overrides(cfg, point, unused)).resolved(digests=False))


def check_trials(cfg: SweepConfig) -> None:
    """Fail before any trial when a trial at the defaults or a check point of the space cannot train."""
    if cfg.driver == "verl":
        check_verl_trials(cfg)
    else:
        check_local_trials(cfg)


def check_local_trials(cfg: SweepConfig) -> None:
    """Compose the training config at the defaults and the space's check points; fail before any trial.

    When the base model exists, ``rank`` is also checked against its hidden size.
    """
    from commrl.rl.config import load_train_config

    for label, point in _check_points(cfg).items():
        try:
            train_cfg = load_train_config(local_overrides(cfg, point, "unused"))
            train_cfg.method_config(hidden_size=model_hidden_size(train_cfg.model.path))
        except ConfigError as err:
            raise ConfigError(f"{label} {dict(point)} is not a valid training run: {err}") from None


def check_verl_trials(cfg: SweepConfig) -> None:
    """``commrl verl-train --dry-run`` (CPU) at the defaults and the space's check points."""
    with tempfile.TemporaryDirectory(prefix="sweep-dry-run-") as tmp:
        for label, point in _check_points(cfg).items():
            done = subprocess.run(
                [*verl_command(cfg, point, Path(tmp) / "run"), "--dry-run"], capture_output=True, text=True
            )
            if done.returncode != 0:
                tail = "\n".join(done.stderr.strip().splitlines()[-5:])
                raise ConfigError(f"{label} {dict(point)} is not a valid verl-train run:\n{tail}")


def _check_points(cfg: SweepConfig) -> dict[str, dict[str, Any]]:
    """A search's defaults and corners, or points that take every value of a grid."""
    return {**({"defaults": cfg.defaults} if cfg.defaults else {}), **cfg.space.check_points()}


def model_hidden_size(model_path: str | Path) -> int | None:
    """The hidden size in ``<model_path>/config.json``, or None when the model is not built yet."""
    path = Path(model_path) / "config.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("hidden_size")
