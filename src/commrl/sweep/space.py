"""The search space of a sweep: the method's four knobs, their bounds, and how a point becomes overrides.

``rank`` (activation and PowerSGD rank, int, usually log scale), ``alpha`` (sign-correction blend, [0, 1]),
``beta`` (dense-memory decay, [0, 1)) and ``cadence`` (anchor cadence K = delay h, int); method.md §2-§3.
A ``SearchSpace`` gives each knob bounds for a sampler; a ``GridSpace`` gives each axis a list of values
(the knobs, and also ``prompts_per_tick`` and the training ``seed``), every combination one trial.
A space is checked in full when it is read, so a bad bound or value fails before any trial starts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from commrl.errors import ConfigError

# name -> (type, smallest allowed low, largest allowed high, whether high itself is allowed)
KNOBS: dict[str, tuple[str, float, float, bool]] = {
    "rank": ("int", 1, math.inf, True),
    "alpha": ("float", 0.0, 1.0, True),
    "beta": ("float", 0.0, 1.0, False),
    "cadence": ("int", 1, math.inf, True),
}
SPEC_KEYS = ("type", "low", "high", "log", "step")
# grid axes that are not method knobs, same layout as KNOBS: the prompts of one tick, the run's seed
RUN_AXES: dict[str, tuple[str, float, float, bool]] = {
    "seed": ("int", 0, math.inf, True),
    "prompts_per_tick": ("int", 1, math.inf, True),
}
AXIS_RANGES = {**KNOBS, **RUN_AXES}  # every grid axis
# the order a grid's points run in: seed-major, so a partial study has whole seeds
GRID_AXES = ("seed", "prompts_per_tick", "rank", "cadence", "alpha", "beta")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class ParamSpec:
    """One searched knob: ``type`` int|float, bounds ``[low, high]``, ``log`` scale or a ``step`` grid."""

    name: str
    type: str
    low: float
    high: float
    log: bool = False
    step: float | None = None

    @classmethod
    def from_dict(cls, name: str, raw: Any) -> ParamSpec:
        field = f"space.{name}"
        if name not in KNOBS:
            raise ConfigError(
                f"{field}: unknown parameter {name!r}; the searchable knobs are {', '.join(KNOBS)}"
            )
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{field} must be a mapping like {{type: int, low: 4, high: 32, log: true}}")
        unknown = sorted(set(raw) - set(SPEC_KEYS))
        if unknown:
            raise ConfigError(
                f"{field}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(SPEC_KEYS)}"
            )
        for key in ("type", "low", "high"):
            if key not in raw:
                raise ConfigError(f"{field}.{key} is missing")
        spec = cls(name, raw["type"], raw["low"], raw["high"], raw.get("log", False), raw.get("step"))
        spec.validate()
        return spec

    def validate(self) -> None:
        field = f"space.{self.name}"
        kind, lo_min, hi_max, hi_closed = KNOBS[self.name]
        if self.type != kind:
            raise ConfigError(
                f"{field}.type={self.type!r} is invalid: {self.name} is searched as type {kind}"
            )
        for key in ("low", "high"):
            value = getattr(self, key)
            if not _is_number(value) or (kind == "int" and not isinstance(value, int)):
                raise ConfigError(
                    f"{field}.{key}={value!r} must be a finite {'integer' if kind == 'int' else 'number'}"
                )
        if self.low > self.high:
            raise ConfigError(f"{field}: low={self.low} > high={self.high}; swap them")
        if self.low < lo_min:
            raise ConfigError(f"{field}.low={self.low} is out of range: {self.name} must be >= {lo_min}")
        if self.high > hi_max or (not hi_closed and self.high >= hi_max):
            bound = f"<= {hi_max}" if hi_closed else f"< {hi_max}"
            hint = " (beta = 1 never updates the dense memory)" if self.name == "beta" else ""
            raise ConfigError(f"{field}.high={self.high} is out of range: {self.name} must be {bound}{hint}")
        if not isinstance(self.log, bool):
            raise ConfigError(f"{field}.log={self.log!r} must be true or false")
        if self.log and self.low <= 0:
            raise ConfigError(
                f"{field}: log scale needs low > 0, got low={self.low}; raise low or set log: false"
            )
        if self.step is not None:
            if self.log:
                raise ConfigError(f"{field}: step and log cannot be combined (Optuna); drop one of them")
            if (
                not _is_number(self.step)
                or self.step <= 0
                or (kind == "int" and not isinstance(self.step, int))
            ):
                raise ConfigError(f"{field}.step={self.step!r} must be a positive {kind}")
            n = (self.high - self.low) / self.step
            if abs(n - round(n)) > 1e-9:
                raise ConfigError(
                    f"{field}.step={self.step} does not divide high - low = {self.high - self.low}; "
                    "adjust high so that it lies on the grid"
                )

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is a point of this dimension (type, bounds and grid)."""
        if not _is_number(value) or (self.type == "int" and not isinstance(value, int)):
            return False
        if not self.low <= value <= self.high:
            return False
        if self.step is None:
            return True
        n = (value - self.low) / self.step
        return abs(n - round(n)) < 1e-9

    def suggest(self, trial) -> int | float:
        """Ask an ``optuna.Trial`` for this dimension (enqueued and retried trials get their fixed value)."""
        if self.type == "int":
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log
            )
        return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "low": self.low, "high": self.high, "log": self.log}
        if self.step is not None:
            out["step"] = self.step
        return out


@dataclass(frozen=True)
class SearchSpace:
    """The searched knobs, in the order of ``KNOBS``."""

    params: tuple[ParamSpec, ...]

    @classmethod
    def from_dict(cls, raw: Any) -> SearchSpace:
        if not isinstance(raw, Mapping) or not raw:
            raise ConfigError(f"space must be a non-empty mapping of knobs ({', '.join(KNOBS)}) to bounds")
        for name in raw:
            if name not in KNOBS:
                raise ConfigError(
                    f"space.{name}: unknown parameter {name!r}; the searchable knobs are {', '.join(KNOBS)}"
                )
        return cls(tuple(ParamSpec.from_dict(name, raw[name]) for name in KNOBS if name in raw))

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def __getitem__(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def check_point(self, point: Any, field: str) -> dict[str, Any]:
        """Validate a full point of the space (e.g. the enqueued defaults); returns it as a plain dict."""
        if not isinstance(point, Mapping):
            raise ConfigError(f"{field} must be a mapping of {', '.join(self.names)} to values")
        missing = [n for n in self.names if n not in point]
        extra = sorted(set(point) - set(self.names))
        if missing or extra:
            raise ConfigError(
                f"{field} must set exactly the searched knobs {', '.join(self.names)}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; not searched: {', '.join(extra)}" if extra else "")
            )
        for p in self.params:
            if not p.contains(point[p.name]):
                raise ConfigError(
                    f"{field}.{p.name}={point[p.name]!r} lies outside space.{p.name} "
                    f"({p.type} in [{p.low}, {p.high}]{f' step {p.step}' if p.step else ''}); move it inside"
                )
        return {p.name: float(point[p.name]) if p.type == "float" else point[p.name] for p in self.params}

    def check_points(self) -> dict[str, dict[str, Any]]:
        """The all-low and the all-high points: every value a trial can take lies between them."""
        return {
            "space (all lows)": {p.name: p.low for p in self.params},
            "space (all highs)": {p.name: p.high for p in self.params},
        }

    def suggest(self, trial) -> dict[str, Any]:
        return {p.name: p.suggest(trial) for p in self.params}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {p.name: p.to_dict() for p in self.params}


@dataclass(frozen=True)
class GridSpace:
    """The values of each grid axis (ascending, in ``GRID_AXES`` order); a trial is one combination.

    A grid with no axes has one point, ``{}`` (a baseline study of a grid without seeds or prompts).
    """

    axes: tuple[tuple[str, tuple[int | float, ...]], ...]

    @classmethod
    def from_dict(cls, raw: Any, field: str = "grid") -> GridSpace:
        if not isinstance(raw, Mapping) or not raw:
            raise ConfigError(
                f"{field} must be a non-empty mapping of axes ({', '.join(GRID_AXES)}) to lists of values, "
                "e.g. {alpha: [0.25, 1.0], cadence: [2, 5]}"
            )
        unknown = sorted(set(raw) - set(AXIS_RANGES))
        if unknown:
            raise ConfigError(
                f"{field}: unknown axis {', '.join(map(repr, unknown))}; "
                f"the grid axes are {', '.join(GRID_AXES)}"
            )
        return cls(
            tuple(
                (name, _grid_values(f"{field}.{name}", name, raw[name])) for name in GRID_AXES if name in raw
            )
        )

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.axes]

    @property
    def size(self) -> int:
        return math.prod(len(values) for _, values in self.axes)

    def values(self, name: str) -> tuple[int | float, ...]:
        return dict(self.axes)[name]

    def points(self) -> list[dict[str, Any]]:
        """Every combination, seed-major (then prompts per tick, rank, cadence, alpha, beta)."""
        return [
            dict(zip(self.names, combo, strict=True))
            for combo in itertools.product(*dict(self.axes).values())
        ]

    def restrict(self, names: Iterable[str]) -> GridSpace:
        """The grid over the axes among ``names`` only."""
        keep = set(names)
        return GridSpace(tuple((name, values) for name, values in self.axes if name in keep))

    def extends(self, stored: Mapping[str, Any]) -> bool:
        """Whether this grid is ``stored`` (a ``to_dict``) with values added: same axes, every value kept."""
        current = self.to_dict()
        return set(stored) == set(current) and all(set(stored[n]) <= set(current[n]) for n in current)

    def check_points(self) -> dict[str, dict[str, Any]]:
        """A few points that together take every value of every axis (as many as the longest axis has)."""
        longest = max((len(values) for _, values in self.axes), default=1)
        return {
            f"grid probe {i + 1}/{longest}": {n: v[i % len(v)] for n, v in self.axes} for i in range(longest)
        }

    def suggest(self, trial) -> dict[str, Any]:
        """The trial's grid point: every trial of a grid study is a queued point, so its values are fixed.
        They are asked as int or float ranges over each axis, which (unlike Optuna's categorical choices)
        may widen when the grid grows."""
        return {
            name: (trial.suggest_int if AXIS_RANGES[name][0] == "int" else trial.suggest_float)(
                name, values[0], values[-1]
            )
            for name, values in self.axes
        }

    def to_dict(self) -> dict[str, list[int | float]]:
        return {name: list(values) for name, values in self.axes}


def _grid_values(field: str, name: str, raw: Any) -> tuple[int | float, ...]:
    """One axis of a grid: a non-empty list of distinct in-range values, returned ascending."""
    kind, low, high, high_closed = AXIS_RANGES[name]
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Iterable):
        raise ConfigError(f"{field}={raw!r} must be a list of values, e.g. [{low:g}, ...]")
    values = list(raw)
    if not values:
        raise ConfigError(f"{field} is an empty list; give at least one value or drop the axis")
    for i, value in enumerate(values):
        if not _is_number(value) or (kind == "int" and not isinstance(value, int)):
            raise ConfigError(
                f"{field}[{i}]={value!r} must be a finite {'integer' if kind == 'int' else 'number'}"
            )
        if value < low or value > high or (not high_closed and value >= high):
            bound = f"<= {high:g}" if high_closed else f"< {high:g}"
            allowed = f">= {low:g}" + ("" if math.isinf(high) else f" and {bound}")
            raise ConfigError(f"{field}[{i}]={value!r} is out of range: {name} must be {allowed}")
    converted = [float(v) if kind == "float" else v for v in values]
    if len(set(converted)) != len(converted):
        repeated = sorted({v for v in converted if converted.count(v) > 1})
        raise ConfigError(f"{field} repeats {', '.join(map(str, repeated))}; list each value once")
    return tuple(sorted(converted))


def point_overrides(params: Mapping[str, Any], driver: str) -> list[str]:
    """A point (a sampled one, or a grid point) as training overrides, without its ``seed``: the caller
    sets the run's seed itself (``seed=`` for the local driver, ``--seed`` for the cluster driver).

    ``prompts_per_tick`` is the local tree's ``rl.prompts_per_tick``; on the paper pairs' tree it is verl's
    batch of prompts with one optimizer step per tick (``train_batch_size`` = ``ppo_mini_batch_size``).
    """
    out = method_overrides({k: v for k, v in params.items() if k in KNOBS}, driver)
    prompts = params.get("prompts_per_tick")
    if prompts is not None and driver == "local":
        out.append(f"rl.prompts_per_tick={prompts}")
    elif prompts is not None:
        out += [
            f"verl.data.train_batch_size={prompts}",
            f"verl.actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        ]
    return out


def method_overrides(params: Mapping[str, Any], driver: str) -> list[str]:
    """A point of the space as training overrides (Hydra for ``local``, ``commrl verl-train`` for ``verl``).

    The anchor delay h follows the cadence K (method.md §3, h = K): the local tree leaves ``method.delay``
    unset, which means K; the paper pairs' tree sets h explicitly, so it is overridden with K.
    """
    out = []
    for name, value in params.items():
        out.append(f"method.{name}={value!r}" if isinstance(value, float) else f"method.{name}={value}")
        if name == "cadence" and driver == "verl":
            out.append(f"method.delay={value}")
    return out
