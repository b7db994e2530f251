"""Creating a study once (``init``) and opening it in every worker.

``init_study`` is the only place that creates the study, enqueues the defaults and creates the MLflow
parent run (concurrent creation of a fresh sqlite study crashes, so workers never create). It is
idempotent: a second call changes nothing, and a call after a crash half-way finishes what is missing.
The study keeps its identity (``SweepConfig.to_dict``: what a trial trains and what its outcome means) in its
user attributes, and beside it the composed config a trial computes with (``trial_config``: a changed
condition or pair file); a worker whose config no longer matches refuses to run. A grid may grow (values
added to its axes): ``init`` then stores the new grid and enqueues the new points. Each worker index counts
its starts in the study (``worker_starts/<index>``), so that a restarted worker samples new points
(``sampler_seed``).
"""

from __future__ import annotations

import numpy as np
import optuna

from commrl import tracking
from commrl.errors import ConfigError
from commrl.run import fingerprint, record
from commrl.sweep.config import PrunerConfig, SamplerConfig, SweepConfig
from commrl.sweep.grid import enqueue_missing
from commrl.sweep.space import GridSpace
from commrl.sweep.storage import open_storage, storage_exists, study_names
from commrl.sweep.trial_config import reference_point, trial_config, trials_dir

IDENTITY_ATTR = "sweep_config"
TRIAL_CONFIG_ATTR = "trial_config"  # what a trial computes with (trial_config.trial_config)
TRIAL_POINT_ATTR = "trial_config_point"  # the point it was composed at
PARENT_ATTR = "mlflow_parent_run_id"
DEFAULTS_ATTR = "defaults_enqueued"
STARTS_ATTR = "worker_starts"  # <STARTS_ATTR>/<index>: how many times a worker of that index opened the study
DIRECTION = "maximize"  # the objective is validation accuracy


class SweepError(RuntimeError):
    """The study cannot be used as asked (missing, not set up); the message says why. A study created with
    other settings is a ``ConfigError`` (``check_identity``)."""


def sampler_seed(seed: int, worker: int, starts: int) -> int:
    """The sampler seed of worker ``worker`` that opened the study ``starts`` times before.

    A first start samples with ``seed + worker`` (workers with one seed would propose the same points), as it
    always did, so a fresh study draws what it drew before. A restart of the same index (a crash, a requeued
    job) would, with that seed, propose again the points its first start trained: it seeds from all three.
    """
    if starts == 0:
        return seed + worker
    return int(np.random.SeedSequence((seed, worker, starts)).generate_state(1)[0])


def make_sampler(cfg: SamplerConfig, worker: int, starts: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler of ``worker``'s start number ``starts`` (0: its first), seeded by ``sampler_seed``."""
    seed = sampler_seed(cfg.seed, worker, starts)
    if cfg.name in ("random", "grid"):  # a grid's trials are queued points: it never samples a value
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(
        multivariate=True, constant_liar=True, n_startup_trials=cfg.n_startup_trials, seed=seed
    )


def make_pruner(cfg: PrunerConfig) -> optuna.pruners.BasePruner:
    opts = dict(cfg.options)
    if cfg.name == "median":
        return optuna.pruners.MedianPruner(**opts)
    if cfg.name == "hyperband":  # max_resource is explicit: "auto" would be estimated per process
        return optuna.pruners.HyperbandPruner(**opts)
    if cfg.name == "threshold":
        return optuna.pruners.ThresholdPruner(**opts)
    return optuna.pruners.NopPruner()


def init_study(cfg: SweepConfig, name: str) -> dict:
    """Create the study, enqueue the defaults as its first trial and create the MLflow parent run, once.

    Returns what ``commrl sweep init`` writes to its output: the study, the storage, the parent run id and
    whether this call created the study.
    """
    storage = open_storage(cfg.storage, cfg.heartbeat, create_dirs=True)
    created = name not in study_names(storage)
    folders = trials_dir(cfg, name)
    if created and folders.is_dir() and any(folders.iterdir()):
        raise SweepError(
            f"{folders} holds the trials of an earlier study named {name!r} (its storage is gone); a new "
            "study would resume from their checkpoints. Remove the folder or choose another --study name"
        )
    if created:
        try:
            study = optuna.create_study(study_name=name, storage=storage, direction=DIRECTION)
        except optuna.exceptions.DuplicatedStudyError:  # another init won the race
            created = False
    if not created:
        study = optuna.load_study(study_name=name, storage=storage)
    check_identity(study, cfg)
    if study.user_attrs.get(IDENTITY_ATTR) != cfg.to_dict():  # new, or a grid that grew
        study.set_user_attr(IDENTITY_ATTR, cfg.to_dict())
    composed, point = check_trial_config(study, cfg)
    if study.user_attrs.get(TRIAL_CONFIG_ATTR) != composed:
        study.set_user_attr(TRIAL_CONFIG_ATTR, composed)
    if study.user_attrs.get(TRIAL_POINT_ATTR) != point:
        study.set_user_attr(TRIAL_POINT_ATTR, point)
    if isinstance(cfg.space, GridSpace):
        enqueue_missing(study, cfg.space)
    elif not study.user_attrs.get(DEFAULTS_ATTR):
        study.enqueue_trial(cfg.defaults, user_attrs={"source": "default"}, skip_if_exists=True)
        study.set_user_attr(DEFAULTS_ATTR, True)
    parent = ensure_parent_run(study, cfg)
    return {
        "study": name,
        "storage": cfg.storage.location,
        "storage_kind": cfg.storage.kind,
        "created": created,
        "mlflow_parent_run_id": parent,
        "defaults": cfg.defaults,
        "n_trials": cfg.n_trials,
        "n_workers": cfg.n_workers,
        "tracking_uri": tracking.default_tracking_uri(),
    }


def open_study(cfg: SweepConfig, name: str, worker: int | None = None) -> optuna.Study:
    """Load an initialised study with the config's pruner. A worker (``worker``: its index) also gets its
    sampler and counts its start (``count_start``); a reader (the summary) counts nothing."""
    if not storage_exists(cfg.storage):
        raise SweepError(f"no study storage at {cfg.storage.location}; run `commrl sweep init` first")
    storage = open_storage(cfg.storage, cfg.heartbeat)
    if name not in study_names(storage):
        raise SweepError(
            f"study {name!r} is not in {cfg.storage.location}; "
            f"run `commrl sweep init --config ... --study {name}` first"
        )
    study = optuna.load_study(study_name=name, storage=storage, pruner=make_pruner(cfg.pruner))
    check_identity(study, cfg)
    check_trial_config(study, cfg)
    if PARENT_ATTR not in study.user_attrs:
        raise SweepError(
            f"study {name!r} has no MLflow parent run; rerun `commrl sweep init` to finish its set-up"
        )
    if worker is not None:
        study.sampler = make_sampler(cfg.sampler, worker, count_start(study, worker))
    return study


def count_start(study: optuna.Study, worker: int) -> int:
    """Record a start of ``worker`` in ``study``; returns how many it had before. Each index has its own key,
    so workers of other indices never race on it."""
    key = f"{STARTS_ATTR}/{worker}"
    starts = int(study.user_attrs.get(key, 0))
    study.set_user_attr(key, starts + 1)
    return starts


def check_identity(study: optuna.Study, cfg: SweepConfig) -> None:
    """A study keeps the settings it was created with; anything else mixes incomparable trials.

    A setting the stored identity lacks (a study created before it was part of the identity, e.g. before
    ``train_overrides``, ``pruner`` and ``defaults`` were) cannot be compared: it is accepted, and the next
    ``init`` records the config's value, checked from then on.
    """
    stored = study.user_attrs.get(IDENTITY_ATTR)
    if stored is None:
        return
    current = cfg.to_dict()
    changed = sorted(k for k in stored if stored[k] != current.get(k))
    if "space" in changed and isinstance(cfg.space, GridSpace) and cfg.space.extends(stored["space"]):
        changed.remove("space")
    if changed:
        detail = "; ".join(
            f"{k}: study has {stored.get(k)!r}, config has {current.get(k)!r}" for k in changed
        )
        raise ConfigError(
            f"study {study.study_name!r} was created with other settings ({detail}); restore them, or "
            "start a new study with another --study name (n_trials, n_workers, the heartbeat and the sampler "
            "may change freely, a grid may gain values)"
        )


def check_trial_config(study: optuna.Study, cfg: SweepConfig) -> tuple[dict, dict]:
    """The composed trial config now (``trial_config``) and its point (the study's, else
    ``reference_point``: a grid that gained a value below an axis's first compares where it did); a
    ``ConfigError`` naming each changed key when the study's trials were trained under another (a changed
    condition or pair file: its new trials would not be comparable with the old ones, and a finished study
    would pass for the new config's). A study created before it kept one has nothing to compare: ``init``
    records it."""
    point = study.user_attrs.get(TRIAL_POINT_ATTR) or reference_point(cfg)
    current = trial_config(cfg, point)
    stored = study.user_attrs.get(TRIAL_CONFIG_ATTR)
    if stored is None:
        return current, point
    changed = fingerprint.differences(stored, current, tick=0)
    fingerprint.warn_version_changes(
        fingerprint.version_changes(stored, current), f"study {study.study_name!r}"
    )
    if changed:
        raise ConfigError(
            f"study {study.study_name!r} was trained under another config of {cfg.pair}/{cfg.condition} "
            "(changed, study -> now):\n  " + "\n  ".join(changed) + "\nRestore it, or start a new study "
            "with another --study name"
        )
    return current, point


def ensure_parent_run(study: optuna.Study, cfg: SweepConfig) -> str:
    """The study's MLflow parent run (tag kind=sweep, experiment commrl/<pair>), created if missing: only
    when the store says it has no such run (it was replaced); any other error of the store (a locked sqlite
    file, a server down) is raised, not answered with a second parent that would split the study's trials."""
    uri = tracking.default_tracking_uri()
    client = tracking.client(uri)
    run_id = study.user_attrs.get(PARENT_ATTR)
    if run_id and record.run_exists(run_id, uri):
        return run_id
    exp_id = tracking.ensure_experiment(tracking.experiment_name(cfg.pair), uri, client)
    tags = {
        "kind": "sweep",
        "direction": DIRECTION,
        "pair": cfg.pair,
        "condition": cfg.condition,
        "driver": cfg.driver,
        "git_commit": tracking.git_commit(),
        "optuna.study": study.study_name,
        "optuna.storage": cfg.storage.location,
    }
    run = client.create_run(exp_id, run_name=f"sweep/{study.study_name}", tags=tags)
    params = {
        "space": cfg.space.to_dict(),
        "defaults": cfg.defaults,
        "ticks": cfg.ticks,
        "read_at": cfg.read_at,
        "val_every": cfg.val_every,
        "seed": cfg.seed,
        "pruner": {"name": cfg.pruner.name, **cfg.pruner.options},
        "sampler": vars(cfg.sampler),
        "train_overrides": " ".join(cfg.train_overrides),
    }
    tracking.log_params(run.info.run_id, params, uri)
    study.set_user_attr(PARENT_ATTR, run.info.run_id)
    return run.info.run_id
