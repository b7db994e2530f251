"""A training run's MLflow record: the run (created or resumed), its tags, its config params, its end.

Both drivers (``LocalTrainer``, ``commrl verl-train``), both sweep drivers and eval go through here, so a run
of either driver carries the same tag set and can be found, read and resumed the same way:

- tags ``pair``, ``condition``, ``codec``, ``seed``, ``driver``, ``kind``, ``read_at``, ``ticks``,
  ``git_commit`` (+ a sweep's ``mlflow.parentRunId`` and ``optuna.*``), set at creation and refreshed on a
  resume (a rerun may extend ``ticks``);
- ``DIR/mlflow_run_id``: the run of an earlier attempt in the same folder, reopened by the next attempt;
- config params: MLflow params are immutable, so a resume logs only the new keys, and a key whose value
  changed is recorded as an artifact (``config/changed_<time>.json``, old and new) and the tag
  ``config_changed`` instead of failing (verl's ``Tracking`` drops its MLflow backend on that error);
- the end: ``finish_run`` (FINISHED | FAILED), or ``mark_preempted`` (KILLED with the tag ``preempted``, the
  tick checkpointed on a preemption request: ``commrl.run.preempt``), which the next attempt reopens;
- a failed or stopped attempt's end tags (``ATTEMPT_TAGS``: ``failure``, ``stopped_early``) are deleted
  when the next attempt reopens the run, so a finished run carries no stale failure; ``preempted`` and
  ``preempted_by`` stay (the run's last preemption, a record of how it was trained).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from commrl import tracking
from commrl.errors import ConfigError

RUN_ID_FILE = "mlflow_run_id"
MAX_TAG_LENGTH = 5000
ATTEMPT_TAGS = ("failure", "stopped_early")
"""Tags a failed or stopped attempt's end sets (the trainers' ``finish_run``); a resume deletes them."""


@dataclass(frozen=True)
class RunSpec:
    """Where the MLflow run goes: kind (``train`` | ``trial``), a parent run (sweeps), a name, extra tags."""

    kind: str = "train"
    parent_run_id: str | None = None
    run_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        """The spec as JSON (``commrl verl-train --run-spec``: how the verl sweep places its child's run)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        try:
            values = json.loads(text)
            return cls(
                kind=str(values.get("kind", "train")),
                parent_run_id=values.get("parent_run_id"),
                run_name=values.get("run_name"),
                tags={str(k): str(v) for k, v in (values.get("tags") or {}).items()},
            )
        except (json.JSONDecodeError, AttributeError, TypeError) as err:
            raise ConfigError(
                f"--run-spec {text!r} is not a JSON object with kind/parent_run_id/run_name/tags ({err})"
            ) from None

    def placement_tags(self) -> dict[str, str]:
        """``kind``, the extra tags and ``mlflow.parentRunId`` (nests a trial under its sweep)."""
        tags = {"kind": self.kind, **self.tags}
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        return tags


@dataclass(frozen=True)
class RunIdentity:
    """What a training run is: (pair, condition, seed), its codec and driver, its ticks and read point."""

    pair: str
    condition: str
    seed: int
    codec: str
    driver: str  # local | verl
    ticks: int
    read_at: int

    @property
    def run_name(self) -> str:
        return tracking.training_run_name(self.pair, self.condition, self.seed)

    def tags(self, spec: RunSpec | None = None) -> dict[str, str]:
        """The full tag set of the run (the report selects and reads runs by these)."""
        return {
            "pair": self.pair,
            "condition": self.condition,
            "codec": self.codec,
            "seed": str(self.seed),
            "driver": self.driver,
            "read_at": str(self.read_at),
            "ticks": str(self.ticks),
            "git_commit": tracking.git_commit(),
            **(spec or RunSpec()).placement_tags(),
        }


def run_id_path(out_dir: Path) -> Path:
    return Path(out_dir) / RUN_ID_FILE


def written_run_id(out_dir: Path) -> str | None:
    """The run id in ``DIR/mlflow_run_id`` (None: no file, or an empty one)."""
    path = run_id_path(out_dir)
    return (path.read_text().strip() or None) if path.is_file() else None


def recorded_run_id(out_dir: Path, tracking_uri: str | None = None) -> str | None:
    """The MLflow run of an earlier attempt in ``out_dir``, if the store still has it."""
    run_id = written_run_id(out_dir)
    return run_id if run_id and run_exists(run_id, tracking_uri) else None


def run_exists(run_id: str, tracking_uri: str | None = None) -> bool:
    """Whether the store has ``run_id``. Only the store's "no such run" is an answer of no: any other error
    (a locked sqlite file, a tracking server that does not answer) is raised, so that a resume fails and is
    retried rather than start a second run and split the first one's ticks from the rest."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode

    try:
        tracking.client(tracking_uri).get_run(run_id)
    except MlflowException as err:
        if err.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
            return False
        raise
    return True


def open_run(
    identity: RunIdentity,
    out_dir: Path,
    tracking_uri: str | None = None,
    spec: RunSpec | None = None,
    run_id: str | None = None,
) -> tuple[str, bool]:
    """The run's MLflow run, RUNNING: ``run_id`` or ``DIR/mlflow_run_id`` reopened if the store has it
    (its earlier attempt's ``ATTEMPT_TAGS`` deleted), else a new run with the full tag set (its id written to
    ``DIR/mlflow_run_id``). Returns (id, resumed)."""
    uri = tracking_uri or tracking.default_tracking_uri()
    client = tracking.client(uri)
    tags = identity.tags(spec)
    for candidate in (run_id, written_run_id(out_dir)):
        if candidate and run_exists(candidate, uri):
            client.update_run(candidate, status="RUNNING")
            _delete_attempt_tags(client, candidate)
            for key, value in tags.items():
                client.set_tag(candidate, key, value)
            _write_run_id(out_dir, candidate)
            return candidate, True
    experiment_id = tracking.ensure_experiment(tracking.experiment_name(identity.pair), uri, client)
    name = (spec.run_name if spec else None) or identity.run_name
    new_id = client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
    _write_run_id(out_dir, new_id)
    return new_id, False


def _delete_attempt_tags(client: Any, run_id: str) -> None:
    """Delete the ``ATTEMPT_TAGS`` an earlier attempt left on ``run_id`` (MLflow refuses a missing one)."""
    have = client.get_run(run_id).data.tags
    for key in ATTEMPT_TAGS:
        if key in have:
            client.delete_tag(run_id, key)


def _write_run_id(out_dir: Path, run_id: str) -> None:
    """``DIR/mlflow_run_id`` through a temporary file and a rename (never half-written)."""
    path = run_id_path(out_dir)
    if written_run_id(out_dir) == run_id:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(run_id + "\n")
    os.replace(tmp, path)


def log_config(run_id: str, params: Mapping[str, Any], tracking_uri: str | None = None) -> dict[str, tuple]:
    """Log ``params`` (nested or flat) as MLflow params without ever failing on a resume.

    Keys the run lacks are logged; keys it has with the same value are skipped; keys whose value changed
    (a rerun with other overrides) are returned as ``{key: (old, new)}``, written to the artifact
    ``config/changed_<unix ms>.json`` and listed in the tag ``config_changed`` (the newest change).
    """
    from mlflow.entities import Param

    client = tracking.client(tracking_uri)
    have = client.get_run(run_id).data.params
    flat = tracking.flatten(params)
    new = [Param(k, v) for k, v in flat.items() if k not in have]
    changed = {k: (have[k], v) for k, v in flat.items() if k in have and have[k] != v}
    for i in range(0, len(new), 100):
        client.log_batch(run_id, params=new[i : i + 100])
    if changed:
        stamp = int(time.time() * 1000)
        client.log_dict(
            run_id,
            {k: {"logged": old, "now": now} for k, (old, now) in changed.items()},
            f"config/changed_{stamp}.json",
        )
        client.set_tag(run_id, "config_changed", ",".join(sorted(changed))[:MAX_TAG_LENGTH])
    return changed


def log_resolved_config(run_id: str, config: Mapping[str, Any], tracking_uri: str | None = None) -> None:
    """The resolved config as the artifact ``config/resolved.yaml`` (replaced on a resume)."""
    tracking.client(tracking_uri).log_dict(
        run_id, json.loads(json.dumps(config, default=str)), "config/resolved.yaml"
    )


def finish_run(
    run_id: str | None, status: str, tags: Mapping[str, str] | None = None, tracking_uri: str | None = None
) -> None:
    """Set ``tags`` and end the run with ``status`` (FINISHED | FAILED | KILLED); no-op without a run."""
    if not run_id:
        return
    client = tracking.client(tracking_uri)
    for key, value in (tags or {}).items():
        client.set_tag(run_id, key, str(value)[:MAX_TAG_LENGTH])
    client.set_terminated(run_id, status)


def mark_preempted(
    run_id: str | None, tick: int | None, signal_name: str, tracking_uri: str | None = None
) -> None:
    """End a run stopped on a preemption request KILLED, not FAILED, with the tags ``preempted`` (the tick
    its checkpoint holds) and ``preempted_by`` (the signal); the rerun reopens it RUNNING (``open_run``)."""
    tags = {"preempted_by": signal_name}
    if tick is not None:
        tags["preempted"] = str(tick)
    finish_run(run_id, "KILLED", tags, tracking_uri)
