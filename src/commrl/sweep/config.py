"""A sweep's configuration file (``configs/sweep/<pair>.yaml``), read and checked in full before any trial.

The objective is fixed: the validation accuracy (``val/acc``) at ``read_at``, maximised; every validation
before it is an intermediate value for the pruner (step = tick). Unknown keys and bad values raise
``ConfigError`` naming the field, the value and the fix.

Two kinds of study: a search (``space`` with bounds, ``defaults`` enqueued first, ``n_trials`` picked by
the sampler, TPE or random) and a grid (``sampler: {name: grid}``, ``grid`` with a list of values per axis,
every point once: ``n_trials`` is the grid's size; no pruning; an optional ``baseline`` condition trained
at every (``prompts_per_tick``, ``seed``) of the grid in a companion study, see ``commrl.sweep.grid``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from commrl import config_tree
from commrl.errors import ConfigError
from commrl.sweep.space import RUN_AXES, GridSpace, SearchSpace, point_overrides

DRIVERS = tuple(config_tree.DRIVER_TREES)
SAMPLERS = ("tpe", "random", "grid")
PRUNERS: dict[str, dict[str, tuple[type, float]]] = {
    # name -> {option: (type, smallest allowed value)}
    "none": {},
    "median": {"n_startup_trials": (int, 0), "n_warmup_steps": (int, 0), "interval_steps": (int, 1)},
    "hyperband": {"min_resource": (int, 1), "max_resource": (int, 1), "reduction_factor": (int, 2)},
    "threshold": {"lower": (float, 0.0), "n_warmup_steps": (int, 0)},
}
SEED_LIMIT = 2**32  # numpy's (the samplers') seeds are below it
REQUIRED = ("pair", "condition", "driver", "n_workers", "ticks", "val_every", "read_at", "storage")
SEARCH_ONLY = ("n_trials", "space", "defaults")  # required by a search; a grid has none but n_trials
GRID_ONLY = ("grid", "baseline")  # `grid` is required by a grid study
# keys of the training config that the sweep sets itself (local driver, cluster driver)
RESERVED_OVERRIDES = (
    "pair",
    "condition",
    "seed",
    "out_dir",
    "rl.ticks",
    "rl.val_every",
    "rl.read_at",
    "ticks",
    "ticks_by_condition",
    "read_at",
    "val_every",
)
TOP_KEYS = (*REQUIRED, *SEARCH_ONLY, *GRID_ONLY, "seed", "heartbeat", "sampler", "pruner", "train_overrides")


@dataclass(frozen=True)
class StorageSpec:
    """Where the study lives: an RDB URL (sqlite, PostgreSQL, MySQL) or a journal file (``*.journal``)."""

    kind: str  # rdb | journal
    location: str  # the URL, or the journal file's path

    @classmethod
    def parse(cls, value: Any) -> StorageSpec:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"storage={value!r} must be a non-empty string")
        if "://" in value:
            return cls("rdb", value)
        if value.endswith(".journal"):
            return cls("journal", value)
        raise ConfigError(
            f"storage={value!r} is neither an RDB URL nor a journal file; give "
            "sqlite:///results/optuna/<pair>.db "
            "(one machine), postgresql://USER@HOST/DB, or a path ending in .journal (several nodes)"
        )

    @property
    def dashboard_target(self) -> str:
        """What ``optuna-dashboard`` takes to open this storage."""
        return self.location


@dataclass(frozen=True)
class HeartbeatConfig:
    """Stale-trial detection: a RUNNING trial without a heartbeat for ``grace`` s is failed and retried."""

    interval: int = 60
    grace: int = 600
    max_retry: int = 2


@dataclass(frozen=True)
class SamplerConfig:
    name: str = "tpe"
    seed: int = 0  # worker w's first start samples with seed + w (``study.sampler_seed``)
    n_startup_trials: int = 4


@dataclass(frozen=True)
class PrunerConfig:
    name: str = "median"
    options: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SweepConfig:
    pair: str
    condition: str
    driver: str
    n_trials: int
    n_workers: int
    ticks: int
    val_every: int
    read_at: int
    storage: StorageSpec
    space: SearchSpace | GridSpace
    defaults: dict[str, Any]  # empty for a grid
    seed: int = 0
    heartbeat: HeartbeatConfig = HeartbeatConfig()
    sampler: SamplerConfig = SamplerConfig()
    pruner: PrunerConfig = PrunerConfig()
    train_overrides: tuple[str, ...] = ()
    baseline: str | None = None  # a grid's baseline condition

    @property
    def is_grid(self) -> bool:
        return isinstance(self.space, GridSpace)

    def baseline_config(self) -> SweepConfig | None:
        """The companion grid of ``baseline``: that condition at every (prompts_per_tick, seed) of the grid
        (the method knobs do not apply to it); None without a baseline."""
        if self.baseline is None:
            return None
        grid = self.space.restrict(RUN_AXES)
        return replace(self, condition=self.baseline, space=grid, n_trials=grid.size, baseline=None)

    @classmethod
    def from_dict(cls, raw: Any) -> SweepConfig:
        if not isinstance(raw, Mapping):
            raise ConfigError("a sweep config must be a mapping (see configs/sweep/tiny.yaml)")
        unknown = sorted(set(raw) - set(TOP_KEYS))
        if unknown:
            raise ConfigError(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(TOP_KEYS)}")
        sampler = _sampler(raw.get("sampler", {}))
        grid = sampler.name == "grid"
        missing = [k for k in (*REQUIRED, *(("grid",) if grid else SEARCH_ONLY)) if k not in raw]
        if missing:
            raise ConfigError(f"missing key(s) {', '.join(missing)}")
        misplaced = [k for k in (("space", "defaults") if grid else GRID_ONLY) if k in raw]
        if misplaced:
            why = (
                "a grid study (sampler: {name: grid}) runs the points of `grid`; drop them"
                if grid
                else "only a grid study has these; set sampler: {name: grid} or drop them"
            )
            raise ConfigError(f"{', '.join(misplaced)}: {why}")
        for key in ("pair", "condition"):
            if not isinstance(raw[key], str) or not raw[key]:
                raise ConfigError(f"{key}={raw[key]!r} must be a non-empty string")
        if raw["driver"] not in DRIVERS:
            raise ConfigError(f"driver={raw['driver']!r} is not one of {', '.join(DRIVERS)}")
        ints = {k: _int(k, raw[k], 1) for k in ("n_workers", "ticks", "val_every", "read_at")}
        if ints["read_at"] > ints["ticks"]:
            raise ConfigError(
                f"read_at={ints['read_at']} is after the last tick (ticks={ints['ticks']}); lower it"
            )
        if ints["read_at"] % ints["val_every"] and ints["read_at"] != ints["ticks"]:
            raise ConfigError(
                f"read_at={ints['read_at']} is not a validation tick "
                f"(a multiple of val_every={ints['val_every']}, "
                f"or ticks={ints['ticks']}); the objective is read there"
            )
        space = GridSpace.from_dict(raw["grid"]) if grid else SearchSpace.from_dict(raw["space"])
        if not grid:
            _check_cadence(space, raw["condition"], raw["driver"])
        ints["n_trials"] = _grid_budget(raw, space) if grid else _int("n_trials", raw["n_trials"], 1)
        if grid and "seed" in raw and "seed" in space.names:
            raise ConfigError(
                f"seed={raw['seed']!r} and grid.seed both set the training seed; drop the top-level seed"
            )
        baseline = _baseline(raw.get("baseline"), raw["condition"]) if grid else None
        overrides = raw.get("train_overrides", [])
        if (
            not isinstance(overrides, Sequence)
            or isinstance(overrides, str)
            or not all(isinstance(o, str) and "=" in o for o in overrides)
        ):
            raise ConfigError(f"train_overrides={overrides!r} must be a list of key=value strings")
        swept = point_overrides(dict.fromkeys(space.names, 0), raw["driver"])  # the keys the sweep sets
        reserved = {*RESERVED_OVERRIDES, *(o.split("=", 1)[0] for o in swept)}
        keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
        clash = [o for o, k in zip(overrides, keys, strict=True) if reserved & {k, k.split(".")[0]}]
        if clash:
            raise ConfigError(
                f"train_overrides {', '.join(clash)}: the sweep sets these itself; "
                "use the config keys instead"
            )
        pruner = _pruner(
            raw.get("pruner", {"name": "none" if grid else "median"}), ints["read_at"], ints["val_every"]
        )
        if grid and pruner.name != "none":
            raise ConfigError(
                f"pruner.name={pruner.name!r}: a grid study reads every point at read_at, and a pruned point "
                "leaves its cell without that seed; use pruner: {name: none}"
            )
        if sampler.seed + ints["n_workers"] - 1 >= SEED_LIMIT:
            raise ConfigError(
                f"sampler.seed={sampler.seed} is too large for n_workers={ints['n_workers']}: worker w "
                "samples with seed + w, which must stay below 2**32; "
                f"use sampler.seed <= {SEED_LIMIT - ints['n_workers']}"
            )
        return cls(
            pair=raw["pair"],
            condition=raw["condition"],
            driver=raw["driver"],
            storage=StorageSpec.parse(raw["storage"]),
            space=space,
            defaults={} if grid else space.check_point(raw["defaults"], "defaults"),
            seed=_int("seed", raw.get("seed", 0), 0),
            heartbeat=_heartbeat(raw.get("heartbeat", {})),
            sampler=sampler,
            pruner=pruner,
            train_overrides=tuple(overrides),
            baseline=baseline,
            **ints,
        )

    def to_dict(self) -> dict[str, Any]:
        """The settings that identify the study (stored in it at init, compared by every worker): what a
        trial trains and what its outcome means. Not ``n_trials``, ``n_workers``, the heartbeat or the
        sampler: they decide how many trials run, where, and which point comes next."""
        return {
            "pair": self.pair,
            "condition": self.condition,
            "driver": self.driver,
            "seed": self.seed,
            "ticks": self.ticks,
            "val_every": self.val_every,
            "read_at": self.read_at,
            "space": self.space.to_dict(),
            "defaults": self.defaults,
            "pruner": {"name": self.pruner.name, **self.pruner.options},
            "train_overrides": sorted(self.train_overrides),
        }


def load_sweep_config(path: str | Path) -> SweepConfig:
    """Read and validate a sweep config file."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read the sweep config {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    try:
        return SweepConfig.from_dict(raw)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name}={value!r} must be an integer >= {low}")
    return value


def _options(name: str, raw: Any, allowed: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{name} must be a mapping")
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise ConfigError(f"{name}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    return raw


def _check_cadence(space: SearchSpace, condition: str, driver: str) -> None:
    """A search over the cadence of a condition whose anchor is on must not reach K = 1: the anchor then
    fires every tick, every update is the dense replay and rank, alpha and beta have no effect (a grid may
    list cadence 1 as a dense control). The anchor flag is the condition file's (``configs/condition/``)."""
    if "cadence" not in space.names or space["cadence"].low >= 2:
        return
    tree = config_tree.tree_dir(config_tree.DRIVER_TREES[driver])
    path = config_tree.condition_dir(tree) / f"{condition}.yaml"
    if not path.is_file():  # an unknown condition is named by the driver when the first trial starts
        return
    from commrl.compression.config import MethodConfig  # imports torch: only for a search that reaches K = 1

    method = (yaml.safe_load(path.read_text()) or {}).get("method") or {}
    if not method.get("anchor", MethodConfig.anchor):
        return
    raise ConfigError(
        f"space.cadence.low={space['cadence'].low} is out of range for condition {condition}: its anchor is "
        "on, and at K = 1 the anchor fires every tick, so every update is the dense replay (dense training) "
        "and rank, alpha and beta have no effect; set low >= 2"
    )


def _grid_budget(raw: Mapping[str, Any], grid: GridSpace) -> int:
    """A grid study runs every point once: ``n_trials`` is the grid's size (give it or leave it out)."""
    if "n_trials" in raw and _int("n_trials", raw["n_trials"], 1) != grid.size:
        raise ConfigError(
            f"n_trials={raw['n_trials']} is not the grid's size ({grid.size} points); "
            "drop n_trials (a grid study runs every point once)"
        )
    return grid.size


def _baseline(value: Any, condition: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"baseline={value!r} must be a condition name, e.g. dense")
    if value == condition:
        raise ConfigError(
            f"baseline={value!r} is the study's own condition; name another one (e.g. dense) or drop it"
        )
    return value


def _heartbeat(raw: Any) -> HeartbeatConfig:
    raw = _options("heartbeat", raw, ("interval", "grace", "max_retry"))
    hb = HeartbeatConfig(
        **{k: _int(f"heartbeat.{k}", v, 0 if k == "max_retry" else 1) for k, v in raw.items()}
    )
    if hb.grace < 2 * hb.interval:
        raise ConfigError(
            f"heartbeat.grace={hb.grace} is below 2 x heartbeat.interval={hb.interval} (one late or failed "
            "heartbeat would fail a live trial); use grace >= 2 x interval"
        )
    return hb


def _sampler(raw: Any) -> SamplerConfig:
    raw = dict(_options("sampler", raw, ("name", "seed", "n_startup_trials")))
    name = raw.pop("name", "tpe")
    if name not in SAMPLERS:
        raise ConfigError(f"sampler.name={name!r} is not one of {', '.join(SAMPLERS)}")
    if name == "grid" and raw:
        raise ConfigError(
            f"sampler: {', '.join(raw)}: the grid sampler takes no options (every point runs once, in order)"
        )
    return SamplerConfig(name, **{k: _int(f"sampler.{k}", v, 0) for k, v in raw.items()})


def _pruner(raw: Any, read_at: int, val_every: int) -> PrunerConfig:
    """The pruner, checked against what a trial reports: val/acc in [0, 1] at every validation tick before
    ``read_at`` (``PruningHooks``), where the pruner is asked."""
    if not isinstance(raw, Mapping) or "name" not in raw:
        raise ConfigError(f"pruner must be a mapping with a name ({', '.join(PRUNERS)})")
    name = raw["name"]
    if name not in PRUNERS:
        raise ConfigError(f"pruner.name={name!r} is not one of {', '.join(PRUNERS)}")
    allowed = PRUNERS[name]
    opts = dict(_options("pruner", {k: v for k, v in raw.items() if k != "name"}, tuple(allowed)))
    for key, value in opts.items():
        kind, low = allowed[key]
        ok = (isinstance(value, int) if kind is int else isinstance(value, int | float)) and not isinstance(
            value, bool
        )
        if not ok or value < low:
            raise ConfigError(
                f"pruner.{key}={value!r} must be {'an integer' if kind is int else 'a number'} >= {low}"
            )
    if name == "hyperband":
        opts.setdefault("min_resource", 1)
        opts.setdefault("reduction_factor", 3)
        if opts.setdefault("max_resource", read_at) > read_at:
            raise ConfigError(
                f"pruner.max_resource={opts['max_resource']} exceeds read_at={read_at}: "
                "no trial reports past it"
            )
        if opts["min_resource"] >= opts["max_resource"]:
            raise ConfigError(
                f"pruner.min_resource={opts['min_resource']} must be below "
                f"max_resource={opts['max_resource']}"
            )
    if name == "threshold" and "lower" not in opts:
        raise ConfigError(
            "pruner.lower is missing: the threshold pruner stops trials whose val/acc is below it"
        )
    if name == "threshold" and opts["lower"] >= 1:
        raise ConfigError(
            f"pruner.lower={opts['lower']} is out of range: val/acc is a fraction in [0, 1], and lower >= 1 "
            "stops every trial short of a perfect score; give lower below 1 (0.05 for 5%)"
        )
    last = (read_at - 1) // val_every * val_every  # the last validation tick before read_at
    if name != "none" and last == 0:
        raise ConfigError(
            f"pruner.name={name!r} can never stop a trial: no validation tick comes before read_at={read_at} "
            f"(val_every={val_every}); lower val_every or use pruner: {{name: none}}"
        )
    first = "min_resource" if name == "hyperband" else "n_warmup_steps"  # the first step it may stop at
    if opts.get(first, 0) > last:
        raise ConfigError(
            f"pruner.{first}={opts[first]} can never stop a trial: the last validation tick before "
            f"read_at={read_at} is {last}; use {first} <= {last} or pruner: {{name: none}}"
        )
    return PrunerConfig(name, opts)
