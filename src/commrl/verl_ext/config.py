"""The cluster driver's run config: commrl's tree (``configs/verl/``) as Hydra overrides of verl's own config.

A run is (pair, condition, seed). ``compose_run`` composes ``configs/verl/config.yaml`` (the pair's model,
data, ticks, the method's knobs and the pair's verl recipe under ``verl:``; the condition's codec switches,
from ``configs/condition/``, shared with the local driver) into a ``VerlRun``. ``run_overrides`` turns
that into ``key=value`` overrides of verl's ``verl/trainer/config/ppo_trainer.yaml`` -- the pair's recipe,
then what commrl derives (model path, data files, ticks, validation cadence, MLflow naming, the engine and
the reward), then the command line's own -- and ``compose_verl_config`` composes verl's config with them,
so verl's Hydra tree stays the single schema.

Off-policy settings are the local driver's keys, read from the tree's ``rl:`` block (a condition file or the
command line sets them): ``rl.rollout_correction`` (``commrl.rl.correction.RolloutCorrection``, validated by
it) becomes verl's ``algorithm.rollout_correction.*`` (decoupled mode: the trainer recomputes the old
log-probs, verl's driver computes the IS weights and the rejection mask), and ``rl.behaviour_logprobs:
sampler`` sets its ``bypass_mode`` (the sampler's log-probs are the clipped objective's ``old``). In bypass
mode the policy loss must change in the workers, which verl 0.9.1's ``RayPPOTrainer`` only does in its own
process, after the workers are built (``apply_bypass_mode``; verl issue #4912): ``run_overrides`` therefore
also sets the workers' ``actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode`` and its
``rollout_correction``. ``rl.staleness > 0`` is rejected: the legacy trainer is synchronous.

How the method config reaches the workers: verl converts ``actor_rollout_ref.actor``/``.model`` into
dataclasses that reject unknown keys, and the engine sees nothing else, so the ``MethodConfig`` travels as
JSON in the environment variable ``COMMRL_METHOD``, set through Ray's job-level runtime environment
(``ray_kwargs.ray_init.runtime_env.env_vars``): every Ray worker of the job (actor, reference, TaskRunner)
gets it, on every node, and it shows in the printed config. The engine is loaded in every worker through
``actor_rollout_ref.model.external_lib=commrl.verl_ext`` (imported by ``HFModelConfig`` before the engine
is built).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from commrl import config_tree, tracking
from commrl.compression.config import MethodConfig
from commrl.errors import ConfigError
from commrl.rl.correction import BEHAVIOUR_LOGPROBS, RolloutCorrection, check_mode

METHOD_ENV = "COMMRL_METHOD"
EXTERNAL_LIB = "commrl.verl_ext"
ENV_VARS_KEY = "ray_kwargs.ray_init.runtime_env.env_vars"
HF_OVERRIDES = "actor_rollout_ref.model.override_config."  # verl passes these to the HF config
# Top-level keys of commrl's tree; an override whose first key is one of these goes to commrl, else to verl.
# (``resources`` records a job's needs for the Slurm profile; the driver itself does not read it.)
COMMRL_KEYS = (
    "pair",
    "condition",
    "seed",
    "model",
    "dataset",
    "ticks",
    "ticks_by_condition",
    "read_at",
    "val_every",
    "unsupported_drivers",
    "method",
    "rl",
    "resources",
    "verl",
)
RL_KEYS = ("staleness", "behaviour_logprobs", "rollout_correction")  # the rl.* keys this driver reads
ROLLOUT_CORRECTION_KEY = "algorithm.rollout_correction"  # verl's; derived from rl.* only
POLICY_LOSS_KEY = "actor_rollout_ref.actor.policy_loss"
STALENESS_UNSUPPORTED = (
    "rl.staleness={k} is not supported by the verl driver: verl 0.9.1's legacy RayPPOTrainer, the trainer "
    "the commrl engine runs in, is synchronous (each tick samples with the weights it then trains), and "
    "its asynchronous trainers (verl.experimental.one_step_off_policy, fully_async_policy) need their own "
    "TaskRunner and a rollout pool apart from the trainer's, which `commrl verl-train` does not drive. "
    "Train rl.staleness > 0 with `commrl train`, or set rl.staleness=0 (rl.behaviour_logprobs and "
    "rl.rollout_correction run synchronously on this driver)"
)


@dataclass(frozen=True)
class VerlRun:
    """One (pair, condition, seed) run of the cluster driver, as composed from ``configs/verl/``."""

    pair: str
    condition: str
    seed: int
    model: str  # a local HF folder or a hub id
    train_dataset: str
    val_dataset: str
    ticks: int
    read_at: int
    val_every: int
    attention_dropout: float
    method: MethodConfig
    verl: Mapping[str, Any] = field(default_factory=dict)  # the pair's verl recipe (nested keys)
    behaviour_logprobs: str = "trainer"  # rl.behaviour_logprobs: sampler = verl's bypass mode
    rollout_correction: RolloutCorrection = field(default_factory=RolloutCorrection)  # rl.rollout_correction

    @property
    def bypass_mode(self) -> bool:
        return self.behaviour_logprobs == "sampler"

    @property
    def run_name(self) -> str:
        return tracking.training_run_name(self.pair, self.condition, self.seed)


def default_config_dir() -> Path:
    """``$COMMRL_VERL_CONFIGS``, else ``configs/verl`` under the working directory or the repository."""
    return config_tree.tree_dir("verl")


def override_key(override: str) -> str:
    """The dotted key an override sets: ``+a.b=1`` -> ``a.b``; ``~a.b`` -> ``a.b``."""
    return override.lstrip("+~").split("=", 1)[0].strip()


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(commrl's overrides, verl's overrides), by the override's first key (``COMMRL_KEYS``)."""
    commrl, verl = [], []
    for override in overrides:
        if "=" not in override and not override.startswith("~"):
            raise ConfigError(
                f"override {override!r} is not key=value (e.g. method.cadence=10, trainer.save_freq=5)"
            )
        (commrl if override_key(override).split(".")[0] in COMMRL_KEYS else verl).append(override)
    return commrl, verl


def compose_run(
    pair: str, condition: str, seed: int, overrides: Sequence[str] = (), config_dir: Path | None = None
) -> VerlRun:
    """Compose ``configs/verl/config.yaml`` for (pair, condition, seed) plus commrl-side overrides.

    The ``condition`` group is ``configs/condition/`` beside the tree (``config_tree``). A ``ticks=N``
    override wins over the pair's ``ticks_by_condition``.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    directory = (config_dir or default_config_dir()).resolve()
    pairs = sorted(p.stem for p in (directory / "pair").glob("*.yaml"))
    if pair not in pairs:
        raise ConfigError(
            f"--pair {pair!r} has no config {directory / 'pair' / (pair + '.yaml')}; "
            f"choose one of {', '.join(pairs)}"
        )
    config_tree.check_condition_name(condition, directory, "verl")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"--seed {seed!r} is invalid: must be an integer >= 0")
    try:
        with initialize_config_dir(config_dir=str(directory), version_base="1.3", job_name="commrl_verl"):
            search = config_tree.searchpath_override(directory)
            run = [search, f"pair={pair}", f"condition={condition}", f"seed={seed}"]
            cfg = compose(config_name="config", overrides=[*run, *overrides])
        values = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"cannot compose the run config from {directory}: {err}") from err
    return run_from_dict(values, explicit_ticks=config_tree.override_value(overrides, "ticks") is not None)


def run_from_dict(values: Mapping[str, Any], explicit_ticks: bool = False) -> VerlRun:
    """A ``VerlRun`` from the composed mapping; missing or out-of-range fields are named.

    ``ticks`` is the pair's ``ticks_by_condition[condition]`` where it has one, unless ``explicit_ticks``
    (``ticks`` was set on the command line, which wins).
    """
    if "condition" not in values:
        raise ConfigError("configs/verl lacks the key 'condition' (each file of configs/condition/ sets it)")
    condition = str(values["condition"])
    config_tree.check_driver(condition, values.get("unsupported_drivers") or {}, "verl")
    unknown = sorted(set(values) - set(COMMRL_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown top-level key(s) {', '.join(unknown)} in configs/verl; known: {', '.join(COMMRL_KEYS)}"
        )
    try:
        model, dataset = values["model"], values["dataset"]
        by_condition = {} if explicit_ticks else dict(values.get("ticks_by_condition") or {})
        ticks = int(by_condition.get(condition, values["ticks"]))
        method = {"seed": int(values["seed"]), **values["method"]}  # the run's seed unless method.seed is set
        run = VerlRun(
            pair=str(values["pair"]),
            condition=condition,
            seed=int(values["seed"]),
            model=str(model.get("path") or model["hub_id"]),
            train_dataset=str(dataset["train"]),
            val_dataset=str(dataset["val"]),
            ticks=ticks,
            read_at=int(values["read_at"]),
            val_every=int(values["val_every"]),
            attention_dropout=float(model.get("attention_dropout", 0.0)),
            method=MethodConfig.from_dict(method),
            verl=dict(values.get("verl") or {}),
            **rl_settings(values.get("rl") or {}),
        )
    except KeyError as err:  # a pair file without model/dataset/ticks/...
        key = err.args[0]
        raise ConfigError(f"configs/verl lacks the key {key!r} (see configs/verl/pair/A.yaml)") from None
    for name in ("ticks", "read_at", "val_every"):
        if getattr(run, name) < 1:
            raise ConfigError(f"{name}={getattr(run, name)} is invalid: must be an integer >= 1")
    if run.read_at > run.ticks:
        raise ConfigError(
            f"read_at={run.read_at} is invalid: the run trains ticks={run.ticks}, so it never reaches its "
            f"read point; set read_at <= {run.ticks} or ticks >= {run.read_at}"
        )
    if not 0.0 <= run.attention_dropout < 1.0:
        raise ConfigError(f"model.attention_dropout={run.attention_dropout} is invalid: must be in [0, 1)")
    return run


def rl_settings(rl: Mapping[str, Any]) -> dict[str, Any]:
    """``behaviour_logprobs`` and ``rollout_correction`` of a ``VerlRun`` from the tree's ``rl:`` block.

    The keys and checks are the local driver's (``RLConfig``, ``RolloutCorrection.validate`` with verl's own
    threshold parsers); errors name the field. ``rl.staleness > 0`` is rejected (``STALENESS_UNSUPPORTED``).
    """
    unknown = sorted(set(rl) - set(RL_KEYS))
    if unknown:
        raise ConfigError(
            f"rl.{unknown[0]} is not read by the verl driver (its rl.* keys: "
            f"{', '.join('rl.' + k for k in RL_KEYS)}); set verl's own keys under `verl:` or on the "
            "command line (e.g. actor_rollout_ref.actor.clip_ratio_low=0.2)"
        )
    staleness = rl.get("staleness", 0)
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
        raise ConfigError(f"rl.staleness={staleness!r} is invalid: must be an integer >= 0")
    if staleness > 0:
        raise ConfigError(STALENESS_UNSUPPORTED.format(k=staleness))
    behaviour = rl.get("behaviour_logprobs", "trainer")
    if behaviour not in BEHAVIOUR_LOGPROBS:
        raise ConfigError(
            f"rl.behaviour_logprobs={behaviour!r} is not one of {', '.join(BEHAVIOUR_LOGPROBS)}"
        )
    raw = dict(rl.get("rollout_correction") or {})
    known = {f.name for f in fields(RolloutCorrection)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"rl.rollout_correction.{unknown[0]} is not a key of verl's rollout correction; known: "
            + ", ".join(sorted(known))
            + " (bypass_mode is rl.behaviour_logprobs=sampler)"
        )
    correction = RolloutCorrection(**raw)
    correction.validate()
    check_mode(behaviour, correction)
    return {"behaviour_logprobs": behaviour, "rollout_correction": correction}


def correction_overrides(run: VerlRun) -> dict[str, Any]:
    """verl's keys for the run's ``rl.behaviour_logprobs`` and ``rl.rollout_correction``.

    Always ``algorithm.rollout_correction.*`` (every key explicit; off = verl's defaults, so a synchronous
    run logs verl's ``rollout_corr/*`` read-outs and corrects nothing). In bypass mode also the workers'
    policy loss: ``loss_mode=bypass_mode`` and its ``rollout_correction`` (a ``RolloutCorrectionConfig``),
    which verl's trainer would set only in its own process after the workers are built.
    """
    out = run.rollout_correction.verl_overrides(run.bypass_mode)
    if run.bypass_mode:
        out[f"{POLICY_LOSS_KEY}.loss_mode"] = "bypass_mode"
        out[f"+{POLICY_LOSS_KEY}.rollout_correction"] = {
            "_target_": "verl.trainer.config.algorithm.RolloutCorrectionConfig",
            **{
                key.rsplit(".", 1)[1]: value
                for key, value in out.items()
                if key.startswith(ROLLOUT_CORRECTION_KEY)
            },
        }
    return out


def check_no_correction_keys(overrides: Sequence[str], where: str) -> None:
    """verl's ``algorithm.rollout_correction.*`` come from ``rl.*`` only (one home for both drivers)."""
    for override in overrides:
        key = override_key(override)
        if key == ROLLOUT_CORRECTION_KEY or key.startswith(ROLLOUT_CORRECTION_KEY + "."):
            name = key[len(ROLLOUT_CORRECTION_KEY) + 1 :] or "<key>"
            rl_name = (
                "rl.behaviour_logprobs=sampler" if name == "bypass_mode" else f"rl.rollout_correction.{name}"
            )
            raise ConfigError(
                f"{key} is set {where}; the verl driver derives verl's {ROLLOUT_CORRECTION_KEY}.* from the "
                f"rl.* keys both drivers share: set {rl_name} instead"
            )


def method_to_env(method: MethodConfig) -> str:
    """The method config as the JSON value of ``COMMRL_METHOD``."""
    return json.dumps(method.to_dict(), sort_keys=True)


def method_from_env(environ: Mapping[str, str] | None = None) -> MethodConfig | None:
    """The method config of this worker (``COMMRL_METHOD``); None outside ``commrl verl-train``."""
    raw = (os.environ if environ is None else environ).get(METHOD_ENV)
    if not raw:
        return None
    try:
        values = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{METHOD_ENV} is not valid JSON ({err}); `commrl verl-train` sets it") from err
    return MethodConfig.from_dict(values)


def hydra_value(value: Any) -> str:
    r"""A Python value in Hydra's override grammar (strings single-quoted, lists and dicts in brackets).

    Inside a quoted value Hydra 1.3 un-escapes only the backslashes before a quote or at the end, so those
    runs are doubled (and the quote escaped); others are literal. OmegaConf resolves ``${...}`` even there,
    so it is written ``\${`` (its escape for a literal ``${``), doubling the backslashes before it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = re.sub(r"(\\*)\$\{", lambda m: 2 * m.group(1) + "\\${", str(value))
    text = re.sub(r"(\\*)('|$)", lambda m: 2 * m.group(1) + ("\\'" if m.group(2) else ""), text)
    return f"'{text}'"


def data_files(run: VerlRun, data_dir: Path, val_file: Path | None = None) -> tuple[Path, Path]:
    """``<data_dir>/<train>/train.parquet`` and ``<data_dir>/<val>/test.parquet`` (or ``val_file``)."""
    train = data_dir / run.train_dataset / "train.parquet"
    val = val_file if val_file is not None else data_dir / run.val_dataset / "test.parquet"
    return train.resolve(), val.resolve()


def reward_file() -> Path:
    """The file verl loads the reward from: ``commrl.rl.reward`` (math-verify on the last ``\\boxed{}``)."""
    import commrl.rl.reward

    return Path(commrl.rl.reward.__file__).resolve()


def run_overrides(
    run: VerlRun,
    out_dir: Path,
    data_dir: Path,
    val_file: Path | None = None,
    tracking_uri: str | None = None,
    mlflow_run_id: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """Overrides of verl's ``ppo_trainer`` for this run: the pair's recipe, commrl's keys, then ``extra``."""
    train, val = data_files(run, data_dir, val_file)
    check_no_correction_keys(
        [f"{key}=" for key, _ in config_tree.flatten(run.verl)], "in the pair's `verl:` recipe"
    )
    check_no_correction_keys(extra, "on the command line")
    derived: dict[str, Any] = {
        "actor_rollout_ref.model.path": run.model,
        "actor_rollout_ref.model.external_lib": EXTERNAL_LIB,
        "data.train_files": str(train),
        "data.val_files": str(val),
        "data.seed": run.seed,
        "actor_rollout_ref.rollout.seed": run.seed,
        "reward.custom_reward_function.path": str(reward_file()),
        "reward.custom_reward_function.name": "compute_score",
        "trainer.total_training_steps": run.ticks,
        "trainer.test_freq": run.val_every,
        "trainer.logger": ["console", "mlflow"],
        "trainer.project_name": tracking.experiment_name(run.pair),
        "trainer.experiment_name": run.run_name,
        "trainer.default_local_dir": str((out_dir / "checkpoints").resolve()),
        "trainer.use_v1": False,  # the V1 trainer needs the TransferQueue package (verl[verl-core])
        **correction_overrides(run),
    }
    env = {
        METHOD_ENV: method_to_env(run.method),
        "MLFLOW_TRACKING_URI": tracking_uri or tracking.default_tracking_uri(),
    }
    if mlflow_run_id:
        env["MLFLOW_RUN_ID"] = mlflow_run_id
    # keys under verl's free-form HF config overrides are not in its schema: added (or replaced) with ++
    overrides = [
        f"{'++' if key.startswith(HF_OVERRIDES) else ''}{key}={hydra_value(value)}"
        for key, value in config_tree.flatten(run.verl)
    ]
    overrides += [f"{key}={hydra_value(value)}" for key, value in derived.items()]
    if run.attention_dropout > 0:
        overrides.append(
            f"+actor_rollout_ref.model.override_config.attention_dropout={run.attention_dropout!r}"
        )
    overrides += [f"+{ENV_VARS_KEY}.{name}={hydra_value(value)}" for name, value in env.items()]
    return [*overrides, *extra]


def verl_config_dir() -> Path:
    import verl

    return Path(verl.__file__).resolve().parent / "trainer" / "config"


def compose_verl_config(overrides: Sequence[str]):
    """verl's ``ppo_trainer`` config (an OmegaConf ``DictConfig``) with the given overrides."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        directory = str(verl_config_dir())
        with initialize_config_dir(config_dir=directory, version_base=None, job_name="commrl_verl"):
            return compose(config_name="ppo_trainer", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(
            f"verl rejected an override: {err}\n(overrides come from configs/verl's `verl:` recipe, from "
            "`commrl verl-train` itself and from the command line; a key verl lacks needs a leading +)"
        ) from err


def compose_verl_run(
    pair: str,
    condition: str,
    seed: int,
    overrides: Sequence[str],
    out_dir: Path,
    data_dir: Path,
    val_file: Path | None = None,
    tracking_uri: str | None = None,
    mlflow_run_id: str | None = None,
    config_dir: str | Path | None = None,
):
    """``(run, cfg)`` of ``commrl verl-train``'s arguments: commrl's keys of ``overrides`` compose the run
    (``compose_run``), the others go to verl's config (``run_overrides``, ``compose_verl_config``), checked
    against each other (``check_verl_config``)."""
    commrl_overrides, verl_overrides = split_overrides(overrides)
    run = compose_run(pair, condition, seed, commrl_overrides, config_dir)
    extra = run_overrides(run, out_dir, data_dir, val_file, tracking_uri, mlflow_run_id, verl_overrides)
    cfg = compose_verl_config(extra)
    if cfg.trainer.max_actor_ckpt_to_keep is None:  # verl's default keeps every checkpoint
        cfg.trainer.max_actor_ckpt_to_keep = checkpoints_to_keep(run, cfg)
    check_verl_config(cfg, run)
    return run, cfg


def slurm_ray_cpus(cfg) -> int | None:
    """Inside a Slurm job (``SLURM_JOB_ID``), verl's ``ray_kwargs.ray_init.num_cpus`` when unset := the CPUs
    this process may run on (``os.sched_getaffinity``); the value set, else None (left as it is).

    Ray counts a node's CPUs, corrected for a CPU quota but not for the cpuset Slurm confines a job step to
    (``task/cgroup``), so it would schedule the node's CPU count on the job's share; verl's own config says
    to fix the number under Slurm ("might cause hang if limited in systems like SLURM")."""
    from omegaconf import OmegaConf

    if "SLURM_JOB_ID" not in os.environ or OmegaConf.select(cfg, "ray_kwargs.ray_init.num_cpus") is not None:
        return None
    cpus = len(os.sched_getaffinity(0))
    OmegaConf.update(cfg, "ray_kwargs.ray_init.num_cpus", cpus, force_add=True)
    return cpus


def layout_error(
    role: str, *, fsdp1: bool, ulysses: int, hybrid: bool, keeps_gathered: bool, anchor: bool
) -> str | None:
    """Why the two circuits cannot run on the ``role`` engine's (``actor`` | ``ref``) parallel layout, or
    None: asked before Ray starts (``check_method_layout``, from the config) and again by each engine on the
    module it built (``engine.TwoCircuitEngineMixin``)."""
    key = f"actor_rollout_ref.{role}"
    if fsdp1:
        return (
            f"{key}.strategy=fsdp (FSDP1) flattens the parameters, which the two circuits cannot compress "
            f"per matrix; set {key}.strategy=fsdp2"
        )
    if ulysses > 1:
        return (
            "ulysses_sequence_parallel_size > 1 splits a sequence's tokens over ranks, which the activation "
            f"codec does not support; set {key}.ulysses_sequence_parallel_size=1"
        )
    if hybrid:
        return (
            "hybrid sharding (fsdp_size < world size) replicates gradient shards, which the sharded PowerSGD "
            f"does not support; set {key}.fsdp_config.fsdp_size=-1"
        )
    if keeps_gathered and anchor:
        return (
            f"{key}.fsdp_config.reshard_after_forward=False keeps the gathered weights after the "
            "old-log-prob pass, so the anchor's dense replay would run on the live weights, not on the view "
            f"it loads into the shards (method.md §3); set {key}.fsdp_config.reshard_after_forward=True "
            "(verl's default) or method.anchor=false"
        )
    return None


def check_method_layout(cfg, method: MethodConfig) -> None:
    """``layout_error`` of the actor, and of the reference when its forward goes through the codec, from
    verl's config: a ``ConfigError`` before Ray starts rather than in the workers minutes into the job."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_reference_policy

    def get(engine, key: str, default):
        value = OmegaConf.select(engine, key)
        return default if value is None else value

    lora = int(OmegaConf.select(cfg, "actor_rollout_ref.model.lora_rank") or 0)
    if lora > 0:
        raise ConfigError(
            f"actor_rollout_ref.model.lora_rank={lora}: with LoRA verl computes the reference on the actor's "
            "engine, through its codec (its dense reference and kl_ref_forward are lost), and the two "
            "circuits would compress the adapters alone; set actor_rollout_ref.model.lora_rank=0"
        )
    world = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    roles = ["actor"]
    if method.kl_ref_forward == "codec" and need_reference_policy(cfg):
        roles.append("ref")
    for role in roles:
        engine = cfg.actor_rollout_ref[role]
        fsdp_size = int(get(engine, "fsdp_config.fsdp_size", -1))
        error = layout_error(
            role,
            fsdp1=engine.strategy == "fsdp",
            ulysses=int(get(engine, "ulysses_sequence_parallel_size", 1)),
            hybrid=0 < fsdp_size < world,
            keeps_gathered=role == "actor" and not get(engine, "fsdp_config.reshard_after_forward", True),
            anchor=method.anchor,
        )
        if error:
            raise ConfigError(error)


def check_verl_config(cfg, run: VerlRun | None = None) -> None:
    """verl's own checks (``validate_config``, as ``main_ppo`` runs them), failures as ``ConfigError``; with
    ``run``, also that verl produces its read point (``check_read_point``)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    if run is not None:
        check_read_point(run, cfg)
        check_method_layout(cfg, run.method)
    check_rollout_correction(cfg)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # verl prints a verdict; stdout carries --dry-run's YAML
            validate_config(
                config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
            )
    except (AssertionError, ValueError, TypeError) as err:
        raise ConfigError(f"verl's config check failed: {err}") from err


def on_schedule(step: int, freq: int, total_steps: int) -> bool:
    """Whether verl's ``fit`` validates (``trainer.test_freq``) or saves (``trainer.save_freq``) after step
    ``step``: ``freq > 0`` and ``step`` a multiple of it, or the last step (``total_steps``)."""
    return freq > 0 and (step >= total_steps or step % freq == 0)


def saves_after_read_point(run: VerlRun, cfg) -> list[int]:
    """The ticks after ``run.read_at`` at which verl's ``fit`` saves a checkpoint (``on_schedule``)."""
    ticks = run.ticks if cfg.trainer.total_training_steps is None else int(cfg.trainer.total_training_steps)
    save_freq = int(cfg.trainer.save_freq)
    return [s for s in range(run.read_at + 1, ticks + 1) if on_schedule(s, save_freq, ticks)]


def checkpoints_to_keep(run: VerlRun, cfg) -> int:
    """verl's ``trainer.max_actor_ckpt_to_keep`` that keeps the read point's checkpoint to the end of the run:
    ``k = 1 + |saves after the read point|``, the fewest that leave it on disk for ``summarize_run``'s export.

    verl's checkpoint manager deletes all but the ``k`` newest checkpoints it saved in its process (a resumed
    process starts its count afresh, so it deletes none of the earlier ones: ``commrl verl-train`` does,
    ``checkpoint.prune_checkpoints``, keeping the read point's). A preemption's extra save comes
    before the run's last tick, which is always a save, so it never adds one past ``k``. Unset, verl keeps
    every checkpoint: about 45 GB each for pair A (README "Disk"), some 300 of them for the paper matrix.
    """
    return 1 + len(saves_after_read_point(run, cfg))


def check_model_source(model: str, pair: str) -> None:
    """The actor's model is one verl's workers can load: a local folder, a remote path verl copies itself
    (``hdfs://...``; not checked here), or a hub id that is cached here or may be downloaded
    (``HF_HUB_OFFLINE`` unset). Else a ``ConfigError`` before Ray starts: verl would fail inside its workers,
    minutes into a job holding a whole GPU node."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    if "://" in model:
        return
    path = Path(model).expanduser()
    if path.is_dir():
        return
    where = f"model.path in configs/verl/pair/{pair}.yaml (or the override model.path=...)"
    not_folder = f"model {model!r} is not a folder; point {where} at a local copy of the model"
    if path.is_absolute() or model.startswith((".", "~")) or path.exists() or model.count("/") > 1:
        raise ConfigError(not_folder)
    try:
        cached = try_to_load_from_cache(model, "config.json")
    except HFValidationError as error:
        raise ConfigError(f"{not_folder} (nor a Hugging Face hub id: {error})") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    if offline and not isinstance(cached, str):
        raise ConfigError(
            f"model {model!r} is a Hugging Face hub id, HF_HUB_OFFLINE is set and this machine has no cached "
            f"copy of it: point {where} at a local copy, or cache it on a networked node with the same "
            f"HF_HOME (huggingface-cli download {model})"
        )


def local_model_folder(model: str) -> Path | None:
    """The folder on this machine that verl's workers load ``model`` from: a local folder, or a hub id's
    snapshot in the Hugging Face cache; None for a remote path (``hdfs://...``) or a hub id not cached."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    if "://" in model:
        return None
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    try:
        cached = try_to_load_from_cache(model, "config.json")
    except HFValidationError:
        return None
    return Path(cached).parent if isinstance(cached, str) else None


def check_read_point(run: VerlRun, cfg) -> None:
    """verl logs ``val/acc`` and saves a checkpoint (the model read) at ``run.read_at``.

    Read from verl's composed config, whose ``trainer.*`` a command line may override (scripts/gpu_smoke.sh
    sets ``trainer.test_freq``): verl's ``fit`` validates every ``trainer.test_freq`` ticks and saves every
    ``trainer.save_freq`` ticks, both also at the last tick (``trainer.total_training_steps``), none when
    the frequency is <= 0.
    """
    trainer = cfg.trainer
    read_at = run.read_at
    ticks = run.ticks if trainer.total_training_steps is None else int(trainer.total_training_steps)
    if read_at > ticks:
        raise ConfigError(
            f"read_at={read_at} is invalid: verl trains trainer.total_training_steps={ticks} ticks, so it "
            f"never reaches its read point; set read_at <= {ticks} or ticks >= {read_at}"
        )
    test_freq, save_freq = int(trainer.test_freq), int(trainer.save_freq)
    if not on_schedule(read_at, test_freq, ticks):
        raise ConfigError(
            f"read_at={read_at} is invalid with val_every (verl's trainer.test_freq)={test_freq}: verl "
            f"validates every val_every ticks and at the last tick ({ticks}), so val/acc at the read point "
            f"is never logged; set read_at to a multiple of val_every or to ticks, or val_every to a divisor "
            f"of {read_at}"
        )
    if not on_schedule(read_at, save_freq, ticks):
        raise ConfigError(
            f"read_at={read_at} is invalid with trainer.save_freq={save_freq}: the read model exists only "
            f"as verl's checkpoint, saved every save_freq ticks and at the last tick ({ticks}); set read_at "
            f"to a multiple of trainer.save_freq or to ticks, or trainer.save_freq to a divisor of {read_at}"
        )
    keep, need = trainer.max_actor_ckpt_to_keep, checkpoints_to_keep(run, cfg)
    if keep is not None and 0 < int(keep) < need:  # verl keeps every checkpoint at 0 (or below)
        raise ConfigError(
            f"trainer.max_actor_ckpt_to_keep={keep} would delete the read point's checkpoint (tick "
            f"{read_at}) before the run exports it: verl keeps the {keep} newest, and it saves at "
            f"{saves_after_read_point(run, cfg)} after the read point; set it to at least {need}, or leave "
            f"it unset (commrl then keeps {need})"
        )


def check_rollout_correction(cfg):
    """verl's ``algorithm.rollout_correction`` as verl's ``RolloutCorrectionConfig`` (returned), and what it
    needs: the sampler's log-probs, without which verl's trainer silently skips a decoupled correction
    (and fails in bypass mode)."""
    from omegaconf.errors import OmegaConfBaseException
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.utils.config import omega_conf_to_dataclass

    try:
        rc = omega_conf_to_dataclass(cfg.algorithm.rollout_correction, RolloutCorrectionConfig)
    except (OmegaConfBaseException, TypeError, ValueError) as err:
        raise ConfigError(f"verl rejected {ROLLOUT_CORRECTION_KEY}: {err}") from err
    active = rc.bypass_mode or rc.rollout_is is not None or rc.rollout_rs is not None
    if active and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        raise ConfigError(
            "rl.behaviour_logprobs=sampler and rl.rollout_correction need the sampler's log-probs, but "
            "actor_rollout_ref.rollout.calculate_log_probs=false (verl then skips the correction); set it "
            "to true (the paper pairs do)"
        )
    return rc


def resolved_yaml(cfg) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(cfg, resolve=True)
