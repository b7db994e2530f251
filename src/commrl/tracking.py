"""MLflow conventions shared by every stage: store location, experiment and run naming, tags, metrics.

- One experiment per pair, ``commrl/<pair>``; one run per training run (pair, condition, seed) or Optuna
  trial; evaluations are nested under the training run they evaluate; sweeps have one parent run each.
- Default store: ``sqlite:///<results>/mlflow.db`` with artifacts in ``<results>/mlartifacts``.
  ``MLFLOW_TRACKING_URI`` overrides it (a tracking server on a cluster: sqlite on a shared filesystem
  is unsafe, and refused inside a Slurm job: ``check_store``).
- Create the store once (``init_store``) before parallel jobs: several processes creating a fresh sqlite
  store at once can leave it half-migrated.
- Metric names are those of ``method.md`` §4; MLflow rejects ``,`` and ``@`` in names, so
  ``metric_key`` maps them.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from commrl.errors import ConfigError

RESULTS_ENV = "COMMRL_RESULTS"
MAX_PARAM_LENGTH = 6000


def results_dir() -> Path:
    """The results root: ``$COMMRL_RESULTS`` or ``./results``."""
    return Path(os.environ.get(RESULTS_ENV, "results")).resolve()


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else the embedded sqlite store under the results root."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{results_dir() / 'mlflow.db'}"


def artifact_root(tracking_uri: str) -> str | None:
    """Artifacts beside a sqlite store (``<dir>/mlartifacts``); None lets a tracking server decide."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        return (db.parent / "mlartifacts").resolve().as_uri()
    return None


def experiment_name(pair: str) -> str:
    """The MLflow experiment of one model/dataset pair."""
    return f"commrl/{pair}"


def training_run_name(pair: str, condition: str, seed: int) -> str:
    return f"{pair}/{condition}/seed{seed}"


def metric_key(name: str) -> str:
    """An MLflow-safe metric key: ``@`` -> ``_at_``, ``,`` -> ``/`` (``acc,avg@8`` -> ``acc/avg_at_8``)."""
    return name.replace("@", "_at_").replace(",", "/")


def git_commit(default: str = "unknown") -> str:
    """The commit of the working tree the code runs from, with ``-dirty`` when it has changes."""
    try:
        root = Path(__file__).resolve().parent
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
        return f"{sha}-dirty" if dirty else sha
    except (OSError, subprocess.SubprocessError):
        return default


def flatten(params: Mapping[str, Any], prefix: str = "", sep: str = ".") -> dict[str, str]:
    """Flatten a nested mapping into ``a.b.c -> str(value)``, as MLflow params."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, name, sep))
        else:
            flat[name] = str(value)[:MAX_PARAM_LENGTH]
    return flat


def _mlflow():
    import mlflow

    return mlflow


# File systems that a cluster's nodes share: sqlite's locks do not hold across nodes there.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "cifs",
        "smb3",
        "beegfs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "panfs",
        "wekafs",
        "fuse.juicefs",
    }
)


def filesystem_type(path: Path, mounts: Path = Path("/proc/mounts")) -> str | None:
    """The type of the file system ``path`` lives on (the longest mount point above it in ``mounts``);
    None when ``mounts`` cannot be read (not Linux)."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    path, best = path.resolve(), (-1, None)
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = Path(fields[1].replace("\\040", " "))
        if (path == point or point in path.parents) and len(point.parts) > best[0]:
            best = (len(point.parts), fields[2])
    return best[1]


def check_store(tracking_uri: str, mounts: Path = Path("/proc/mounts")) -> None:
    """Inside a Slurm job (``SLURM_JOB_ID``), refuse a sqlite store on a file system the nodes share: jobs
    on several nodes lock it up or corrupt it. ``ConfigError`` names the fix (a tracking server)."""
    if not os.environ.get("SLURM_JOB_ID") or not tracking_uri.startswith("sqlite:///"):
        return
    db = Path(tracking_uri.removeprefix("sqlite:///").split("?")[0])
    kind = filesystem_type(db.parent, mounts)
    if kind in NETWORK_FILESYSTEMS:
        raise ConfigError(
            f"MLFLOW_TRACKING_URI={tracking_uri} is a sqlite file on a {kind} file system that the cluster's "
            "nodes share, where jobs on several nodes lock up or corrupt it; run an MLflow tracking server "
            "and export MLFLOW_TRACKING_URI=http://HOST:PORT before starting (README, Slurm step 2)"
        )


def client(tracking_uri: str | None = None):
    """An ``MlflowClient`` on the given (or default) store (``check_store`` first)."""
    mlflow = _mlflow()
    uri = tracking_uri or default_tracking_uri()
    check_store(uri)
    return mlflow.MlflowClient(tracking_uri=uri)


def init_store(experiments: Iterable[str] = (), tracking_uri: str | None = None) -> str:
    """Create the store (migrations) and the given experiments once; idempotent. Returns the URI."""
    uri = tracking_uri or default_tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    c = client(uri)
    for name in experiments:
        ensure_experiment(name, uri, c)
    return uri


def ensure_experiment(name: str, tracking_uri: str | None = None, mlflow_client=None) -> str:
    """The id of experiment ``name``, created with artifacts beside a sqlite store if it is missing."""
    uri = tracking_uri or default_tracking_uri()
    c = mlflow_client or client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    from mlflow.exceptions import MlflowException

    try:
        return c.create_experiment(name, artifact_location=_experiment_artifacts(uri, name))
    except MlflowException:  # created by a concurrent process in the meantime
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def _experiment_artifacts(uri: str, name: str) -> str | None:
    root = artifact_root(uri)
    return None if root is None else f"{root}/{name.replace('/', '_')}"


class MetricLogger:
    """Buffers per-tick metrics and writes them with one ``log_batch`` call per flush.

    ``log(step, metrics)`` keeps the values; ``flush()`` sends them. Non-finite values are kept (MLflow
    stores NaN), keys are made MLflow-safe.
    """

    def __init__(self, run_id: str, tracking_uri: str | None = None, flush_every: int = 1):
        self.run_id = run_id
        self.client = client(tracking_uri)
        self.flush_every = max(1, flush_every)
        self._pending: list = []
        self._steps_pending = 0

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        for key, value in metrics.items():
            self._pending.append(Metric(metric_key(key), float(value), now, int(step)))
        self._steps_pending += 1
        if self._steps_pending >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self.client.log_batch(self.run_id, metrics=self._pending)
        self._pending, self._steps_pending = [], 0


def log_params(run_id: str, params: Mapping[str, Any], tracking_uri: str | None = None) -> None:
    """Log a (nested) mapping as flattened params, in batches of MLflow's limit."""
    from mlflow.entities import Param

    c = client(tracking_uri)
    items = [Param(k, v) for k, v in flatten(params).items()]
    for i in range(0, len(items), 100):
        c.log_batch(run_id, params=items[i : i + 100])


def find_runs(experiment: str, tags: Mapping[str, str], tracking_uri: str | None = None) -> list:
    """Runs of ``experiment`` whose tags equal ``tags`` (newest first); empty if the experiment is missing."""
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    flt = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    return list(
        c.search_runs([exp.experiment_id], filter_string=flt, order_by=["attributes.start_time DESC"])
    )
