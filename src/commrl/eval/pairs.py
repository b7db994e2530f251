"""Evaluation settings of each model/dataset pair: response budget, chat prompt and inference engine.

The response budget of a pair is its training response length, read from the pair's own training config
(the one source): ``verl.data.max_response_length`` of ``configs/verl/pair/<pair>.yaml`` (method.md §5:
3072 tokens for pair A, 4096 for pair B), with ``max_model_len`` = ``verl.data.max_prompt_length`` + that;
``sampler.max_new_tokens`` of ``configs/train/pair/<pair>.yaml`` for a local pair (the tiny one), whose
``max_model_len`` is its model's context (``EVAL_DEFAULTS``). So an evaluation gives a response the budget
training gave it: a chain of thought cut off there scores 0, in evaluation as in the reward. That is the
RL stage's budget, not the literature's for the base models: R1-distilled models (pair B) are reported at
32768 tokens, where many of their chains of thought that 4096 cuts off end; pair B's absolute scores, the
base model's above all, are therefore below those (README, "Evaluation"). Every field can be overridden
from a YAML file (``--config``) or the CLI (``--max-gen-toks``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commrl import config_tree
from commrl.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16", "auto")


@dataclass(frozen=True)
class PairSettings:
    """How the checkpoints of one pair are evaluated.

    ``system_prompt`` None means no system message (the chat template's default), as in training.
    ``batch_size`` applies to the hf backend (vLLM batches on its own). ``seed`` is the vLLM engine seed:
    it makes sampled runs reproducible while the ``k`` samples of a problem still differ.
    """

    pair: str
    max_gen_toks: int
    max_model_len: int
    system_prompt: str | None = None
    dtype: str = "bfloat16"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    enforce_eager: bool = False
    batch_size: int | str = "auto"
    seed: int = 1234

    def __post_init__(self) -> None:
        for name in ("max_gen_toks", "max_model_len", "tensor_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"eval.{name}={value!r} must be an integer >= 1 (pair {self.pair})")
        if self.max_gen_toks >= self.max_model_len:
            raise ConfigError(
                f"eval.max_gen_toks={self.max_gen_toks} must be below eval.max_model_len="
                f"{self.max_model_len} (pair {self.pair}): the prompt needs room; raise max_model_len"
            )
        if self.dtype not in DTYPES:
            raise ConfigError(f"eval.dtype={self.dtype!r} is not one of {', '.join(DTYPES)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"eval.gpu_memory_utilization={self.gpu_memory_utilization!r} must be in (0, 1]"
            )
        batch = self.batch_size
        if batch != "auto" and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
            raise ConfigError(f"eval.batch_size={self.batch_size!r} must be 'auto' or an integer >= 1")


# What only evaluation decides, per pair (the budget comes from the pair's training config).
EVAL_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": dict(max_model_len=512, dtype="float32", enforce_eager=True, batch_size=32),  # 512: its context
}
TREES = ("train", "verl")  # the drivers' config trees that hold pair files


def pair_files(pair: str, config_root: Path | None = None) -> dict[str, Path]:
    """``tree -> <tree>/pair/<pair>.yaml`` for each driver's tree (under ``config_root`` if given, else
    where the drivers find their trees: ``configs/<tree>`` or ``$COMMRL_<TREE>_CONFIGS``)."""
    files = {}
    for tree in TREES:
        if config_root is not None:
            files[tree] = config_root / tree / "pair" / f"{pair}.yaml"
            continue
        try:
            files[tree] = config_tree.tree_dir(tree) / "pair" / f"{pair}.yaml"
        except ConfigError:
            continue  # no such tree here: its pairs are unknown
    return files


def training_budget(pair: str, config_root: Path | None = None) -> dict[str, int]:
    """``max_gen_toks`` (and ``max_model_len`` for a verl pair) from the pair's training config; ``{}``
    when no driver's tree has the pair."""
    found = {tree: path for tree, path in pair_files(pair, config_root).items() if path.is_file()}
    if len(found) > 1:
        raise ConfigError(f"pair {pair!r} is defined twice ({', '.join(map(str, found.values()))}); keep one")
    if not found:
        return {}
    tree, path = next(iter(found.items()))
    data = _read_config(path)
    if tree == "train":
        return {"max_gen_toks": _setting(data, ("sampler", "max_new_tokens"), path)}
    response = _setting(data, ("verl", "data", "max_response_length"), path)
    prompt = _setting(data, ("verl", "data", "max_prompt_length"), path)
    return {"max_gen_toks": response, "max_model_len": prompt + response}


def pair_settings(
    pair: str, config: str | Path | None = None, *, config_root: Path | None = None, **overrides: Any
) -> PairSettings:
    """The settings of ``pair``: ``EVAL_DEFAULTS``, the budget of its training config
    (``training_budget``), then the keys of YAML file ``config``, then ``overrides`` (None values are
    ignored). A pair without a training config needs ``max_gen_toks`` and ``max_model_len``."""
    values: dict[str, Any] = {**EVAL_DEFAULTS.get(pair, {}), **training_budget(pair, config_root)}
    if config is not None:
        values.update(_read_config(Path(config)))
    values.update({k: v for k, v in overrides.items() if v is not None})
    values["pair"] = pair
    fields = {f.name for f in dataclasses.fields(PairSettings)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(
            f"unknown eval setting(s) {', '.join(unknown)}; allowed: {', '.join(sorted(fields))}"
        )
    missing = [name for name in ("max_gen_toks", "max_model_len") if name not in values]
    if missing:
        files = pair_files(pair, config_root)
        known = sorted({p.stem for path in files.values() for p in path.parent.glob("*.yaml")})
        raise ConfigError(
            f"pair {pair!r} has no eval settings for {', '.join(missing)}: no training config "
            f"{' or '.join(map(str, files.values()))} to read them from (known pairs: {', '.join(known)}); "
            "pass --max-gen-toks/--max-model-len or a --config YAML with them"
        )
    return PairSettings(**values)


def _setting(data: dict[str, Any], keys: tuple[str, ...], path: Path) -> int:
    value: Any = data
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{path} has no integer {'.'.join(keys)} (got {value!r}): the pair's training response budget, "
            "which evaluation reads; set it there or pass --max-gen-toks/--max-model-len"
        )
    return value


def _read_config(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise ConfigError(f"eval config {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"eval config {path} must map setting: value, got {type(data).__name__}")
    return data
