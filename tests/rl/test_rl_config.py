"""The training config is validated before any model loads."""

import dataclasses
import shutil
from pathlib import Path

import pytest
import yaml

from commrl.errors import ConfigError
from commrl.rl.config import TrainConfig, compose_train_config, load_train_config

REPO = Path(__file__).resolve().parents[2]
CONDITION_FILES = sorted((REPO / "configs" / "condition").glob("*.yaml"))


@pytest.mark.parametrize("path", CONDITION_FILES, ids=lambda p: p.stem)
def test_every_condition_composes_from_its_one_file(path):
    """Each file of configs/condition/ is the local driver's condition: its name, method knobs, dropout."""
    spec = yaml.safe_load(path.read_text())
    raw = compose_train_config([f"condition={path.stem}", "seed=2"])
    assert raw["condition"] == spec["condition"] == path.stem
    assert raw["out_dir"] == f"results/runs/tiny/{path.stem}/seed2"
    assert spec["method"].items() <= raw["method"].items()
    assert raw["model"]["attention_dropout"] == spec.get("model", {}).get("attention_dropout", 0.0)
    TrainConfig.from_dict(raw)  # and it validates


def test_the_local_only_condition_runs_on_the_local_driver():
    cfg = load_train_config(["condition=method_same_sampler"])
    assert cfg.sampler.codec == "same" and "verl" in cfg.unsupported_drivers


def test_anchor_only_is_the_method_without_fast_steps():
    method = load_train_config(["condition=method"]).method_config()
    anchor_only = load_train_config(["condition=anchor_only"]).method_config()
    assert anchor_only.fast_step is False and method.fast_step is True
    assert anchor_only == dataclasses.replace(method, fast_step=False)


def test_unknown_condition_lists_the_known_ones():
    with pytest.raises(
        ConfigError, match=r"condition 'nope' has no config .*nope\.yaml; choose one of "
    ) as err:
        compose_train_config(["condition=nope"])
    listed = str(err.value).split("choose one of ")[1].split(", ")
    assert listed == sorted(listed)
    assert {"anchor_off", "dense", "method", "method_same_sampler", "method_async", "dense_async_tis"} <= set(
        listed
    )


def _tree(tmp_path: Path) -> Path:
    """A copy of configs/train and configs/condition (the driver reads the conditions beside its tree)."""
    for name in ("train", "condition"):
        shutil.copytree(REPO / "configs" / name, tmp_path / name)
    return tmp_path / "train"


def test_a_condition_the_local_driver_cannot_run_is_rejected_with_the_reason(tmp_path):
    tree = _tree(tmp_path)
    (tmp_path / "condition" / "gpu_only.yaml").write_text(
        "# @package _global_\ncondition: gpu_only\nunsupported_drivers: {local: it needs NCCL}\n"
    )
    with pytest.raises(
        ConfigError, match=r"condition 'gpu_only' does not run on the local driver: it needs NCCL"
    ):
        load_train_config(["condition=gpu_only"], tree)
    (tmp_path / "condition" / "gpu_only.yaml").write_text(
        "# @package _global_\ncondition: gpu_only\nunsupported_drivers: {slurm: why}\n"
    )
    with pytest.raises(ConfigError, match=r"names unknown driver\(s\) slurm; drivers: local, verl"):
        load_train_config(["condition=gpu_only"], tree)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("rl.lr=-1", "rl.lr"),
        ("rl.group_size=1", "rl.group_size"),
        ("sampler.backend=sglang", "sampler.backend"),
        ("rl.read_at=1000", "rl.read_at"),
        ("+rl.lrr=3", "rl.lrr"),
        ("rl.prompts_per_tick=0", "rl.prompts_per_tick"),
        ("rl.mini_batches=3", "rl.prompts_per_tick"),  # 16 prompts do not split into 3 mini-batches
        ("rl.micro_batch_size=48", "rl.micro_batch_size=48 must divide the mini-batch of 128"),
        ("health.kl_slope=-1", "health.kl_slope"),  # an alarm on every tick
        ("health.corr_drop=-5", "health.corr_drop"),
        ("health.clipfrac_accel=-0.1", "health.clipfrac_accel"),
        ("sampler.gpu_memory_utilization=7", "sampler.gpu_memory_utilization"),
        ("threads=-2", "threads=-2 is out of range"),
        ("rl.rollout_correction.loss_type=reinforce", "loss_type='reinforce' is invalid with rl.behaviour"),
        ("rl.read_at=15", "rl.read_at=15 is invalid with rl.val_every=10"),
    ],
)
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_train_config([override])


def test_a_stale_sampler_on_the_trainers_codec_is_refused():
    """The weight history has no codec bases: a stale sampler would pair old weights with the live codec."""
    with pytest.raises(ConfigError, match=r"sampler\.codec=same with rl\.staleness=1 is not supported"):
        load_train_config(["condition=method_same_sampler", "rl.staleness=1"])
    assert load_train_config(["condition=method_same_sampler"]).sampler.codec == "same"


def test_a_sampler_on_a_prf_mask_codec_is_refused():
    """The sampler's PRF masks have no per-step key: every decoding step of a tick would draw one mask."""
    with pytest.raises(
        ConfigError, match=r"sampler\.codec=same with method\.codec=prf_mask is not supported"
    ):
        load_train_config(["condition=prf_mask", "sampler.codec=same"])


def test_method_values_are_checked_by_the_method_config():
    raw = compose_train_config(["method.alpha=1.5"])
    with pytest.raises(ConfigError, match="alpha"):
        TrainConfig.from_dict(raw)
    raw = compose_train_config(["method.rank=500"])
    cfg = TrainConfig.from_dict(raw)  # rank vs hidden size is checked once the model's width is known
    with pytest.raises(ConfigError, match="rank"):
        cfg.method_config(hidden_size=128)


@pytest.mark.parametrize(
    ("raw", "override", "message"),
    [
        ({"rl": {"tickz": 3}}, "rl.tickz=3", r"^unknown config key rl\.tickz; allowed under rl: .*\bticks\b"),
        ({"rl": {"ticks": "x"}}, "rl.ticks=x", r"^rl\.ticks='x' must be an integer$"),
        ({"rl": {"betas": [0.9, "x"]}}, "rl.betas=[0.9,x]", r"^rl\.betas\[1\]='x' must be a number$"),
        ({"tracking": {"enabled": "maybe"}}, "tracking.enabled=maybe", r"^tracking\.enabled='maybe' must be"),
        ({"bogus": 1}, "bogus=1", r"^unknown config key bogus; allowed under the top level: .*\bseed\b"),
        ({"method": {"alpha": 2}}, "method.alpha=2", r"^method\.alpha=2 is invalid: must be in \[0, 1\]"),
    ],
)
def test_keys_and_types_are_checked_by_the_schema_on_both_paths(raw, override, message):
    """A plain mapping (``from_dict``) and a Hydra override fail the same way, naming the field once."""
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_dict(raw)
    with pytest.raises(ConfigError, match=message):
        load_train_config([override])


def test_the_schema_keeps_free_form_values_for_their_own_checks():
    """verl's str-or-float thresholds (``Any``) pass the schema as given; betas are checked by range."""
    cfg = TrainConfig.from_dict(
        {"rl": {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": "0.5_2.0"}}}
    )
    assert cfg.rl.rollout_correction.rollout_is_threshold == "0.5_2.0" and cfg.rl.betas == [0.9, 0.999]
    with pytest.raises(ConfigError, match=r"^rl\.betas=\[0\.9\] is invalid: AdamW's 2 betas"):
        TrainConfig.from_dict({"rl": {"betas": [0.9]}})
