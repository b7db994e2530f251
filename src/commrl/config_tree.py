"""Where commrl's config trees live, and the condition group both drivers share.

``configs/train/`` (the local driver's Hydra tree) and ``configs/verl/`` (the cluster driver's) sit beside
``configs/condition/``, one file per condition: the ``condition`` group of both trees, found through Hydra's
search path (``searchpath_override``). A condition file (package ``_global_``) sets ``condition`` (its
name), ``method`` (``MethodConfig`` knobs), optionally ``model.attention_dropout`` (trainer-only attention
dropout, read by both drivers), ``rl.staleness`` / ``rl.behaviour_logprobs`` / ``rl.rollout_correction``
(asynchrony and verl's rollout correction, read by both drivers), keys only the local driver knows
(``sampler``) and ``unsupported_drivers``:
driver -> why that driver cannot run the condition (absent: every driver runs it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from commrl.errors import ConfigError

DRIVERS = {"local": "commrl train", "verl": "commrl verl-train"}  # driver -> its command
DRIVER_TREES = {"local": "train", "verl": "verl"}  # driver -> its config tree
TREE_ENVS = {"train": "COMMRL_TRAIN_CONFIGS", "verl": "COMMRL_VERL_CONFIGS"}  # tree -> its env override
CONDITION_GROUP = "condition"
REPO = Path(__file__).resolve().parents[2]


def tree_dir(tree: str) -> Path:
    """``$COMMRL_<TREE>_CONFIGS``, else ``configs/<tree>`` under the working directory or the repository."""
    env_name = TREE_ENVS[tree]
    env = os.environ.get(env_name)
    if env:
        return Path(env).resolve()
    for root in (Path.cwd(), REPO):
        candidate = root / "configs" / tree
        if candidate.is_dir():
            return candidate.resolve()
    raise ConfigError(f"cannot find configs/{tree}; run from the repository root or set {env_name}")


def condition_dir(tree: Path) -> Path:
    """The condition group of a driver's tree: ``<tree>/../condition`` (``configs/condition/``)."""
    return tree.parent / CONDITION_GROUP


def known_conditions(tree: Path, driver: str) -> list[str]:
    """The conditions ``driver`` runs (their ``unsupported_drivers`` does not name it), sorted."""
    import yaml

    names = []
    for path in sorted(condition_dir(tree).glob("*.yaml")):
        unsupported = (yaml.safe_load(path.read_text()) or {}).get("unsupported_drivers") or {}
        if driver not in unsupported:
            names.append(path.stem)
    return names


def check_condition_name(condition: str, tree: Path, driver: str) -> None:
    """Fail naming the conditions ``driver`` runs when ``condition`` has no file in the condition group."""
    path = condition_dir(tree) / f"{condition}.yaml"
    if not path.is_file():
        known = ", ".join(known_conditions(tree, driver)) or "(none)"
        raise ConfigError(f"condition {condition!r} has no config {path}; choose one of {known}")


def searchpath_override(tree: Path) -> str:
    """The Hydra override that adds the parent of ``configs/condition/`` to the search path of ``tree``."""
    root = str(tree.parent).replace("\\", "\\\\").replace("'", "\\'")
    return f"hydra.searchpath=['file://{root}']"


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """The value the last ``key=value`` (or ``+key=``/``++key=``) override of ``key`` sets, else None."""
    found = None
    for override in overrides:
        name, sep, value = override.lstrip("+").partition("=")
        if sep and name.strip() == key:
            found = value.strip()
    return found


def check_driver(condition: str, unsupported: Any, driver: str) -> None:
    """Fail when the condition's ``unsupported_drivers`` names ``driver`` (with why) or is malformed."""
    where = f"configs/condition/{condition}.yaml"
    if not isinstance(unsupported, Mapping):
        raise ConfigError(f"unsupported_drivers in {where} must map a driver to why it cannot run it")
    unknown = sorted(set(unsupported) - set(DRIVERS))
    if unknown:
        raise ConfigError(
            f"unsupported_drivers in {where} names unknown driver(s) {', '.join(unknown)}; "
            f"drivers: {', '.join(DRIVERS)}"
        )
    if driver in unsupported:
        others = [f"`{command}`" for name, command in DRIVERS.items() if name not in unsupported]
        fix = f"; run it with {' or '.join(others)}" if others else ""
        raise ConfigError(
            f"condition {condition!r} does not run on the {driver} driver: {unsupported[driver]} "
            f"(unsupported_drivers.{driver} in {where}){fix}"
        )


def flatten(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, leaf value) pairs of a nested mapping; an empty mapping is a leaf."""
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            yield from flatten(value, name)
        else:
            yield name, value
