"""Evaluation settings of each model/dataset pair: response budget, chat prompt and inference engine.

The response budget of a pair is its training response length (method.md §5: 3072 tokens for pair A,
4096 for pair B; the tiny pair's is ``sampler.max_new_tokens`` in ``configs/train/pair/tiny.yaml``), so
an evaluation never truncates a chain of thought the policy was trained to write. ``max_model_len`` is
prompt + response budget. Every field can be overridden from a YAML file (``--config``) or the CLI.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commrl.eval.errors import PairConfigError

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
                raise PairConfigError(f"eval.{name}={value!r} must be an integer >= 1 (pair {self.pair})")
        if self.max_gen_toks >= self.max_model_len:
            raise PairConfigError(
                f"eval.max_gen_toks={self.max_gen_toks} must be below eval.max_model_len="
                f"{self.max_model_len} (pair {self.pair}): the prompt needs room; raise max_model_len"
            )
        if self.dtype not in DTYPES:
            raise PairConfigError(f"eval.dtype={self.dtype!r} is not one of {', '.join(DTYPES)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise PairConfigError(
                f"eval.gpu_memory_utilization={self.gpu_memory_utilization!r} must be in (0, 1]"
            )
        batch = self.batch_size
        if batch != "auto" and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
            raise PairConfigError(f"eval.batch_size={self.batch_size!r} must be 'auto' or an integer >= 1")


PAIRS: dict[str, PairSettings] = {
    "tiny": PairSettings(
        "tiny", max_gen_toks=24, max_model_len=512, dtype="float32", enforce_eager=True, batch_size=32
    ),
    "A": PairSettings("A", max_gen_toks=3072, max_model_len=4096),
    "B": PairSettings("B", max_gen_toks=4096, max_model_len=5120),
}


def pair_settings(pair: str, config: str | Path | None = None, **overrides: Any) -> PairSettings:
    """The settings of ``pair``: the registry's, then the keys of YAML file ``config``, then ``overrides``
    (None values are ignored). A pair outside the registry needs ``max_gen_toks`` and ``max_model_len``."""
    values: dict[str, Any] = dataclasses.asdict(PAIRS[pair]) if pair in PAIRS else {}
    if config is not None:
        values.update(_read_config(Path(config)))
    values.update({k: v for k, v in overrides.items() if v is not None})
    values["pair"] = pair
    fields = {f.name for f in dataclasses.fields(PairSettings)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise PairConfigError(
            f"unknown eval setting(s) {', '.join(unknown)}; allowed: {', '.join(sorted(fields))}"
        )
    missing = [name for name in ("max_gen_toks", "max_model_len") if name not in values]
    if missing:
        raise PairConfigError(
            f"pair {pair!r} has no eval settings for {', '.join(missing)} (known pairs: {', '.join(PAIRS)}); "
            "pass --max-gen-toks/--max-model-len or a --config YAML with them"
        )
    return PairSettings(**values)


def _read_config(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise PairConfigError(f"eval config {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise PairConfigError(f"eval config {path} must map setting: value, got {type(data).__name__}")
    return data
