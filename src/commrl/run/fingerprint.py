"""A run's config fingerprint: what it computes with, recorded when it starts and checked by every resume.

Both drivers resume a run from its newest checkpoint. Under another config that resume would mix two configs
in one run, or train nothing and publish the old run as the new config's. So each run records its resolved
config, flattened to dotted keys (``of``): the local driver in every checkpoint's state
(``commrl.rl.trainer``: the config with its method resolved, defaults included, and its model and data
folders absolute), the verl driver in ``<out_dir>/run_config.json`` before verl's first step
(``commrl.verl_ext.checkpoint``: the run's identity, read point and method, and verl's composed config
under ``verl.``). A resume compares the config it is given now with that record (``check_resume``) and
refuses with a ``ConfigError`` naming each differing key with its recorded and current value, and the two
ways on: restore the config, or move or delete the run's folder to train afresh (nothing is deleted here).
A checkpoint written before runs recorded their config resumes unchecked, with a warning on stderr.

``EXEMPT`` keys are not recorded: they change where a run lives, how it is recorded, how it checkpoints or
which resources compute it, not what it computes (a key covers the keys under it; ``*`` any part):

- the run's place: ``out_dir`` (relative or absolute), verl's ``trainer.default_local_dir`` (e.g. a scratch
  file system) and the path of commrl's reward module (where commrl is installed);
- tracking, logging, profiling: ``tracking``, verl's MLflow project and run names, loggers, rollout and
  validation dumps, profilers, and the Ray environment (it carries the MLflow run and the method, which is
  recorded as ``method``);
- checkpoints and resuming: ``checkpoint`` (cadence, how many are kept) and verl's ``save_freq``,
  checkpoints kept, ``resume_mode``/``resume_from_path`` and ``val_only`` (set by the driver itself);
- resources: ``threads``, the sampler's memory (``sampler.kv_cache_gib``, ``gpu_memory_utilization``; verl's
  ``*.gpu_memory_utilization``), verl's nodes and GPUs per node (``*.nnodes``, ``*.n_gpus_per_node``);
- ``unsupported_drivers``: a condition's note on the drivers that cannot run it.

A key that only one side has (``(not set) -> value``, ``value -> (not set)``) is not refused but listed in a
warning: both sides are resolved configs with every default, so such a key comes from another commrl or verl
version (a setting added, renamed or removed), not from the run's config. An upgrade that adds a setting keeps
the old behaviour at its default; the warning names each key so that a non-default one can be checked. A key
one side has where the other has a key above or below it is refused as a changed setting: a value turned into
a mapping or back (``override_config: {}`` filled, ``kl_ctrl`` set to ``null``).

Both drivers also record what their model and data hold (``content_digest`` of the weights and config,
``model_files``, and of the train and validation files): the local driver as ``model.digest`` and
``data.digest``, the verl driver as ``digest.model`` and ``digest.data`` (its model a local folder or a hub
id's snapshot cached on this machine; a remote path or an uncached hub id has none). So a base policy or
dataset rebuilt in place under the same path refuses the resume instead of republishing the old run.

The run's length and read point are recorded but may move forward: ``rl.ticks`` (verl:
``trainer.total_training_steps``) may grow, extending a run, finished or not, but not fall below the
checkpoint's tick; ``rl.read_at`` (verl: ``read_at``) may move to a tick after the checkpoint's (its model is
saved when training reaches it), not to one the run has already passed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from commrl.config_tree import flatten
from commrl.errors import ConfigError

EXEMPT = (
    # the run's place
    "out_dir",
    "verl.trainer.default_local_dir",
    "verl.reward.custom_reward_function.path",
    # tracking, logging, profiling
    "tracking",
    "verl.trainer.project_name",
    "verl.trainer.experiment_name",
    "verl.trainer.logger",
    "verl.trainer.log_val_generations",
    "verl.trainer.rollout_data_dir",
    "verl.trainer.validation_data_dir",
    "verl.global_profiler",
    "verl.*.profiler",
    "verl.ray_kwargs",
    # checkpoints and resuming
    "checkpoint",
    "verl.trainer.save_freq",
    "verl.trainer.max_actor_ckpt_to_keep",
    "verl.trainer.max_critic_ckpt_to_keep",
    "verl.trainer.esi_redundant_time",
    "verl.trainer.del_local_ckpt_after_load",
    "verl.trainer.resume_mode",
    "verl.trainer.resume_from_path",
    "verl.trainer.val_only",
    # resources
    "threads",
    "sampler.kv_cache_gib",
    "sampler.gpu_memory_utilization",
    "verl.*.nnodes",
    "verl.*.n_gpus_per_node",
    "verl.*.gpu_memory_utilization",
    "verl.trainer.ray_wait_register_center_timeout",
    # a condition's note
    "unsupported_drivers",
)
TICKS_KEYS = ("rl.ticks", "verl.trainer.total_training_steps")  # may grow, not below the checkpoint
READ_AT_KEYS = ("rl.read_at", "read_at")  # may move past the checkpoint
_UNSET = object()


def model_files(folder: Path) -> list[Path]:
    """What a model folder's digest covers (``content_digest``): its weights and its config."""
    return [*folder.glob("*.safetensors"), *folder.glob("*.bin"), folder / "config.json"]


def content_digest(files: Sequence[Path]) -> str | None:
    """sha256 over the names and bytes of ``files`` that exist, in sorted order (None when none does): what
    a model or data folder holds, so that one rebuilt in place under the same path is another input."""
    present = sorted(Path(f) for f in files if Path(f).is_file())
    if not present:
        return None
    digest = hashlib.sha256()
    for path in present:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def exempt(key: str) -> bool:
    """Whether the dotted ``key`` is one of ``EXEMPT`` or under one."""
    return any(fnmatchcase(key, pattern) or fnmatchcase(key, pattern + ".*") for pattern in EXEMPT)


def of(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as a run records it: dotted keys (an empty mapping is a value), JSON values (paths as
    strings), the ``EXEMPT`` keys left out."""
    plain = json.loads(json.dumps(config, default=str))
    return {key: value for key, value in flatten(plain) if not exempt(key)}


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any], tick: int) -> list[str]:
    """``key: recorded -> current`` for each key that a resume at ``tick`` must not change: a key both sides
    have with another value, or a key one side has where the other has a key above or below it (a value
    turned into a mapping or back, e.g. ``{}`` -> ``{'a': 1}``, ``None`` -> ``{'type': 'fixed'}``).
    ``EXEMPT`` keys of an older record are ignored; run length and read point may move forward."""
    out = [(key, line) for key, line, reshaped in _one_side(recorded, current) if reshaped]
    for key in sorted(set(recorded) & set(current)):
        old, new = recorded[key], current[key]
        if old == new or exempt(key):
            continue
        if key in TICKS_KEYS and isinstance(new, int):
            if new >= tick:
                continue
            why = f" (the checkpoint is at tick {tick}: a run may be extended, not cut below it)"
        elif key in READ_AT_KEYS and isinstance(new, int):
            if new > tick:
                continue
            why = f" (the run has trained to tick {tick}: the read point may move only past it)"
        else:
            why = ""
        out.append((key, f"{key}: {_show(old)} -> {_show(new)}{why}"))
    return [line for _, line in sorted(out)]


def version_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``key: recorded -> current`` for each non-``EXEMPT`` key only one side has, with no key above or below
    it on the other side: a setting another commrl or verl version added, renamed or removed (both sides hold
    every default)."""
    return [line for _, line, reshaped in _one_side(recorded, current) if not reshaped]


def _one_side(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """``(key, "key: recorded -> current", reshaped)`` for each non-``EXEMPT`` key only one side has, sorted;
    ``reshaped`` when the other side has a key above or below it (the same setting in another shape)."""
    keys = (set(recorded), set(current))
    covered = tuple({p for key in side for p in _paths(key)} for side in keys)  # each key and those above it
    out = []
    for key in sorted(keys[0] ^ keys[1]):
        if exempt(key):
            continue
        other = 1 if key in recorded else 0
        above = any(p in keys[other] for p in _paths(key)[:-1])
        line = f"{key}: {_show(recorded.get(key, _UNSET))} -> {_show(current.get(key, _UNSET))}"
        out.append((key, line, above or key in covered[other]))
    return out


def _paths(key: str) -> list[str]:
    """``a``, ``a.b``, ``a.b.c`` for ``a.b.c``: the keys above a dotted key, then the key."""
    parts = key.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts) + 1)]


def warn_version_changes(changes: Sequence[str], what: str) -> None:
    """Print ``version_changes`` of ``what`` (a run, a study) on stderr, if any."""
    if changes:
        print(
            f"commrl: warning: {what} was recorded by another commrl or verl version: these settings exist "
            "on one side only (recorded -> now); continuing, as a new setting keeps the old behaviour at its "
            "default -- check any that is not at its default:\n  " + "\n  ".join(changes),
            file=sys.stderr,
        )


def _show(value: Any) -> str:
    return "(not set)" if value is _UNSET else repr(value)


def check_resume(
    recorded: Mapping[str, Any] | None, current: Mapping[str, Any], tick: int, folders: Sequence[Path]
) -> None:
    """Refuse to resume the run of ``folders`` (its out_dir first), checkpointed at ``tick`` with the config
    ``recorded``, under ``current`` if they differ (``ConfigError``); warn when there is no record."""
    where = " and ".join(str(f) for f in folders)
    if recorded is None:
        print(
            f"commrl: warning: the run in {where} (checkpointed at tick {tick}) has no config record (it "
            "started before runs recorded theirs); resuming it unchecked: it must be the config it was "
            "trained with",
            file=sys.stderr,
        )
        return
    diffs = differences(recorded, current, tick)
    warn_version_changes(version_changes(recorded, current), f"the run in {where}")
    if diffs:
        raise ConfigError(
            f"{folders[0]} holds a run checkpointed at tick {tick} under another config; resuming it would "
            "mix the two configs in one run. Changed (checkpointed -> now):\n  "
            + "\n  ".join(diffs)
            + f"\nRestore these settings to resume it, or move or delete {where} to train this config "
            "afresh (nothing is deleted automatically)"
        )
