"""The configuration of one local training run, validated before any model loads.

The Hydra tree in ``configs/train/`` (with the conditions of ``configs/condition/``, shared with the cluster
driver), whose structured schema is ``TrainConfig``, composes into a plain mapping; ``TrainConfig.from_dict``
turns a mapping into these dataclasses through the same schema (OmegaConf rejects unknown keys and wrong
types), then each part's ``validate`` checks its ranges. Every failure is a ``ConfigError`` naming the
field's dotted path, the value and what is allowed. The method's own knobs go to
``commrl.compression.MethodConfig``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commrl import config_tree
from commrl.errors import ConfigError
from commrl.rl.correction import BEHAVIOUR_LOGPROBS, RolloutCorrection, check_mode

if TYPE_CHECKING:
    from omegaconf.errors import OmegaConfBaseException

SCHEMA_NAME = "commrl_train_schema"  # the structured schema the Hydra tree starts from (configs/train)


@dataclass
class ModelConfig:
    path: str = "results/models/tiny-base"
    dtype: str = "float32"
    attention_dropout: float = 0.0  # trainer-only attention dropout (the `dropout` control)

    def validate(self) -> None:
        _choice("model.dtype", self.dtype, ("float32", "bfloat16"))
        _range("model.attention_dropout", self.attention_dropout, 0.0, 1.0, hi_open=True)


@dataclass
class DataConfig:
    dir: str = "results/data/toy"
    train_file: str = "train.parquet"
    val_file: str = "validation.parquet"
    val_limit: int = 0  # 0 = the whole validation split

    def validate(self) -> None:
        _range("data.val_limit", self.val_limit, 0, None)


@dataclass
class SamplerConfig:
    backend: str = "vllm"  # vllm | hf
    temperature: float = 1.0
    max_new_tokens: int = 24
    codec: str = "none"  # none | same: the sampler runs the trainer's activation codec too (the note's fix)
    kv_cache_gib: int = 1  # on a CPU the KV cache's ceiling (it takes what its sequences need)
    gpu_memory_utilization: float = 0.5

    def validate(self) -> None:
        _choice("sampler.backend", self.backend, ("vllm", "hf"))
        _choice("sampler.codec", self.codec, ("none", "same"))
        _range("sampler.temperature", self.temperature, 0.0, None, lo_open=True)
        _range("sampler.max_new_tokens", self.max_new_tokens, 1, None)
        _range("sampler.kv_cache_gib", self.kv_cache_gib, 1, None)
        _range("sampler.gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, lo_open=True)


@dataclass
class RLConfig:
    ticks: int = 60
    prompts_per_tick: int = 16
    group_size: int = 8  # n responses per prompt
    mini_batches: int = 2  # optimizer steps per fast tick (GRPO mini-batches)
    micro_batch_size: int = 64  # sequences per forward/backward
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW
    grad_clip: float = 1.0
    clip_ratio: float = 0.2
    kl_coef: float = 0.001
    kl_type: str = "low_var_kl"
    loss_agg_mode: str = "token-mean"
    norm_adv_by_std: bool = True
    val_every: int = 10
    read_at: int = 60
    staleness: int = 0  # k: tick t trains on rollouts sampled with the weights of tick t - k (async RL)
    behaviour_logprobs: str = "trainer"  # trainer: recompute old (decoupled) | sampler: verl's bypass mode
    rollout_correction: RolloutCorrection = field(default_factory=RolloutCorrection)  # verl's keys

    def validate(self) -> None:
        check_length(self.ticks, self.read_at, self.staleness)
        _range("rl.prompts_per_tick", self.prompts_per_tick, 1, None)
        _range("rl.group_size", self.group_size, 2, None)
        _range("rl.mini_batches", self.mini_batches, 1, None)
        if self.prompts_per_tick % self.mini_batches:
            raise ConfigError(
                f"rl.prompts_per_tick={self.prompts_per_tick} is not divisible by rl.mini_batches="
                f"{self.mini_batches}; each mini-batch takes whole groups"
            )
        _range("rl.micro_batch_size", self.micro_batch_size, 1, None)
        per_mini = self.prompts_per_tick // self.mini_batches * self.group_size
        if per_mini % self.micro_batch_size and self.micro_batch_size < per_mini:
            raise ConfigError(
                f"rl.micro_batch_size={self.micro_batch_size} must divide the mini-batch of {per_mini} "
                "sequences (rl.prompts_per_tick / rl.mini_batches x rl.group_size), or be at least it"
            )
        _range("rl.lr", self.lr, 0.0, None, lo_open=True)
        _range("rl.weight_decay", self.weight_decay, 0.0, None)
        _range("rl.grad_clip", self.grad_clip, 0.0, None, lo_open=True)
        _range("rl.clip_ratio", self.clip_ratio, 0.0, 1.0, lo_open=True, hi_open=True)
        _range("rl.kl_coef", self.kl_coef, 0.0, None)
        _choice("rl.kl_type", self.kl_type, ("low_var_kl", "k3", "kl", "k1", "mse", "k2", "abs"))
        _choice(
            "rl.loss_agg_mode",
            self.loss_agg_mode,
            (
                "token-mean",
                "token-sum",
                "seq-mean-token-sum",
                "seq-mean-token-mean",
                "seq-mean-token-sum-norm",
            ),
        )
        _range("rl.val_every", self.val_every, 1, None)
        if self.read_at != self.ticks and self.read_at % self.val_every:
            raise ConfigError(
                f"rl.read_at={self.read_at} is invalid with rl.val_every={self.val_every}: the run "
                f"validates every val_every ticks and at its last ({self.ticks}), so val/acc at the read "
                f"point is never logged (the report would read tick "
                f"{self.read_at - self.read_at % self.val_every}'s); set read_at to a multiple of val_every "
                "or to rl.ticks"
            )
        _choice("rl.behaviour_logprobs", self.behaviour_logprobs, BEHAVIOUR_LOGPROBS)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"rl.betas={self.betas!r} is invalid: AdamW's 2 betas, each in [0, 1)")
        self.rollout_correction.validate()
        check_mode(self.behaviour_logprobs, self.rollout_correction)


@dataclass
class CheckpointConfig:
    every: int = 10  # ticks between checkpoints (metrics reach MLflow at each checkpoint)
    keep: int = 2

    def validate(self) -> None:
        _range("checkpoint.every", self.every, 1, None)
        _range("checkpoint.keep", self.keep, 1, None)


@dataclass
class HealthConfig:
    """Collapse early warning (``health/alarm``): thresholds over a trailing window of ticks."""

    window: int = 10
    kl_slope: float = 0.5  # nats per tick of actor/kl_loss (least-squares slope over the window)
    clipfrac_accel: float = 0.01  # second difference of actor/pg_clipfrac, window mean
    corr_drop: float = 0.5  # drop of mismatch/logprob_corr from its first-window mean
    stop_on_alarm: bool = False

    def validate(self) -> None:
        _range("health.window", self.window, 3, None)
        _range("health.kl_slope", self.kl_slope, 0.0, None)
        _range("health.clipfrac_accel", self.clipfrac_accel, 0.0, None)
        _range("health.corr_drop", self.corr_drop, 0.0, None)


@dataclass
class TrackingConfig:
    uri: str = ""  # empty: $MLFLOW_TRACKING_URI or results/mlflow.db
    enabled: bool = True


@dataclass
class TrainConfig:
    pair: str = "tiny"
    condition: str = "method"
    unsupported_drivers: dict[str, str] = field(default_factory=dict)  # driver -> why (configs/condition/)
    seed: int = 0
    out_dir: str = "results/runs/tiny/method/seed0"
    threads: int = 0  # torch intra-op threads; 0 = leave as is
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    method: dict[str, Any] = field(default_factory=dict)  # -> commrl.compression.MethodConfig
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TrainConfig:
        """Build through the structured schema (keys, types), then validate (ranges): ``ConfigError``."""
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        if not isinstance(raw, Mapping):
            raise ConfigError(f"the training config must be a mapping, got {type(raw).__name__}")
        try:
            cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), raw))
        except OmegaConfBaseException as err:
            raise _schema_error(err) from None
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if not self.pair:
            raise ConfigError("pair is empty; set pair=<name> (e.g. pair=tiny)")
        config_tree.check_driver(self.condition, self.unsupported_drivers, "local")
        _range("threads", self.threads, 0, None)
        for part in (self.model, self.data, self.sampler, self.rl, self.checkpoint, self.health):
            part.validate()
        if self.sampler.codec == "same" and self.rl.staleness > 0:
            raise ConfigError(
                f"sampler.codec=same with rl.staleness={self.rl.staleness} is not supported: the weight "
                "history keeps the weights of each tick but not the codec's bases, so a stale sampler would "
                "run the live codec on old weights; set rl.staleness=0 or sampler.codec=none"
            )
        method = self.method_config()
        if self.sampler.codec == "same" and method.codec == "prf_mask":
            raise ConfigError(
                "sampler.codec=same with method.codec=prf_mask is not supported: the sampler's masks are "
                "keyed by tick and compression point alone, so every decoding step of a tick would draw the "
                "same mask; set sampler.codec=none (the note's fix concerns the low-rank codec)"
            )

    def method_config(self, hidden_size: int | None = None):
        """The validated ``MethodConfig`` of this run (``hidden_size`` checks rank < hidden)."""
        from commrl.compression import MethodConfig

        return MethodConfig.from_dict({"seed": self.seed, **self.method}).validate(hidden_size)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolved(self, digests: bool = True) -> dict[str, Any]:
        """What the run computes with (``commrl.run.fingerprint``): the config, its method resolved (defaults
        included), its model and data folders absolute and, with ``digests``, what they hold
        (``model.digest``: its weights and config; ``data.digest``: the train and validation files; a
        folder not built yet has none)."""
        from commrl.run.fingerprint import content_digest, model_files

        values = self.to_dict()
        values["method"] = self.method_config().to_dict()
        values["model"]["path"] = os.path.abspath(self.model.path)
        values["data"]["dir"] = os.path.abspath(self.data.dir)
        if digests:
            model, data = Path(self.model.path), Path(self.data.dir)
            splits = [data / self.data.train_file, data / self.data.val_file]
            for part, files in (("model", model_files(model)), ("data", splits)):
                if (digest := content_digest(files)) is not None:
                    values[part]["digest"] = digest
        return values

    @property
    def out_path(self) -> Path:
        return Path(self.out_dir)


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}


def _schema_error(err: OmegaConfBaseException) -> ConfigError:
    """OmegaConf's rejection of a key or a value of ``TrainConfig`` as a ``ConfigError`` naming its path."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    path = err.full_key or ""
    reason = (err.msg or str(err)).splitlines()[0]
    if not path:
        return ConfigError(f"the training config is invalid: {reason}")
    if isinstance(err, ConfigKeyError | ConfigAttributeError) and dataclasses.is_dataclass(err.object_type):
        parent = path.rpartition(".")[0]
        allowed = ", ".join(sorted(f.name for f in dataclasses.fields(err.object_type)))
        return ConfigError(f"unknown config key {path}; allowed under {parent or 'the top level'}: {allowed}")
    kind = _kind(_field_type(path))
    return ConfigError(f"{path}={err.value!r} must be {kind}" if kind else f"{path}={err.value!r}: {reason}")


def _field_type(path: str) -> Any:
    """The declared type at a dotted ``path`` of ``TrainConfig`` (``rl.betas[1]`` -> float), else None."""
    tp: Any = TrainConfig
    for part in re.findall(r"[^.\[\]]+", path):
        if dataclasses.is_dataclass(tp):
            tp = typing.get_type_hints(tp).get(part)
        else:
            args = typing.get_args(tp)
            tp = args[-1] if args else None  # list[float] -> float, dict[str, X] -> X
        if tp is None:
            return None
    return tp


def _kind(tp: Any) -> str | None:
    """What a field of type ``tp`` accepts, in words (None for ``Any``)."""
    if dataclasses.is_dataclass(tp) or typing.get_origin(tp) is dict:
        return "a mapping"
    return _KINDS.get(typing.get_origin(tp) or tp)


def check_length(ticks: int, read_at: int, staleness: int) -> None:
    """What a run's length bounds: ``rl.ticks >= 1``, ``rl.read_at`` in ``[1, ticks]``, ``rl.staleness`` in
    ``[0, ticks - 1]``. The workflow asks these of a condition's tick override when Snakemake plans
    (``compose_train_config`` alone: a whole validation imports torch and verl)."""
    _range("rl.ticks", ticks, 1, None)
    _range("rl.read_at", read_at, 1, ticks)
    _range("rl.staleness", staleness, 0, ticks - 1)


def _range(name: str, value: float, lo: float | None, hi: float | None, lo_open=False, hi_open=False) -> None:
    bad = (lo is not None and (value < lo or (lo_open and value == lo))) or (
        hi is not None and (value > hi or (hi_open and value == hi))
    )
    if bad:
        lo_s = "-inf" if lo is None else str(lo)
        hi_s = "inf" if hi is None else str(hi)
        interval = (
            f"{'(' if lo_open or lo is None else '['}{lo_s}, {hi_s}{')' if hi_open or hi is None else ']'}"
        )
        raise ConfigError(f"{name}={value!r} is out of range; allowed: {interval}")


def _choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}")


def default_config_dir() -> Path:
    """``$COMMRL_TRAIN_CONFIGS``, else ``configs/train`` under the working directory or the repository."""
    return config_tree.tree_dir("train")


def compose_train_config(overrides: Sequence[str] = (), config_dir: Path | None = None) -> dict[str, Any]:
    """Compose ``configs/train/config.yaml`` with Hydra overrides into a plain resolved mapping.

    The ``condition`` group is ``configs/condition/`` beside the tree (``config_tree``); an unknown
    condition fails naming the known ones.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    ConfigStore.instance().store(name=SCHEMA_NAME, node=TrainConfig)
    directory = (config_dir or default_config_dir()).resolve()
    condition = config_tree.override_value(overrides, "condition")
    if condition is not None:
        config_tree.check_condition_name(condition, directory, "local")
    search = config_tree.searchpath_override(directory)
    try:
        with initialize_config_dir(config_dir=str(directory), version_base="1.3", job_name="commrl_train"):
            cfg = compose(config_name="config", overrides=[search, *overrides])
        return OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        cause = _schema_cause(err)
        if cause is not None:
            raise _schema_error(cause) from None
        raise ConfigError(f"cannot compose the training config from {directory}: {err}") from err


def _schema_cause(err: BaseException) -> OmegaConfBaseException | None:
    """The OmegaConf error behind a Hydra composition error that names a field of the schema, if any."""
    from omegaconf.errors import OmegaConfBaseException

    while err is not None:
        if isinstance(err, OmegaConfBaseException) and err.full_key:
            return err
        err = err.__cause__
    return None


def load_train_config(overrides: Sequence[str] = (), config_dir: Path | None = None) -> TrainConfig:
    """Compose and validate the configuration of one run."""
    return TrainConfig.from_dict(compose_train_config(overrides, config_dir))
