"""The training config is validated before any model loads."""

import pytest

from commrl.rl.config import ConfigError, TrainConfig, compose_train_config, load_train_config


def test_every_condition_composes_with_the_tiny_pair():
    for cond in (
        "dense",
        "method",
        "no_projection",
        "anchor_off",
        "prf_mask",
        "dropout",
        "method_same_sampler",
    ):
        raw = compose_train_config([f"condition={cond}", "seed=2"])
        assert raw["condition"] == cond
        assert raw["out_dir"] == f"results/runs/tiny/{cond}/seed2"
    assert compose_train_config(["condition=dropout"])["model"]["attention_dropout"] > 0
    assert compose_train_config(["condition=method_same_sampler"])["sampler"]["codec"] == "same"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("rl.lr=-1", "rl.lr"),
        ("rl.group_size=1", "rl.group_size"),
        ("sampler.backend=sglang", "sampler.backend"),
        ("rl.read_at=1000", "rl.read_at"),
        ("+rl.lrr=3", "rl.lrr"),
        ("rl.prompts_per_tick=15", "rl.prompts_per_tick"),
    ],
)
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_train_config([override])


def test_method_values_are_checked_by_the_method_config():
    raw = compose_train_config(["method.alpha=1.5"])
    with pytest.raises(ConfigError, match="alpha"):
        TrainConfig.from_dict(raw)
    raw = compose_train_config(["method.rank=500"])
    cfg = TrainConfig.from_dict(raw)  # rank vs hidden size is checked once the model's width is known
    with pytest.raises(ConfigError, match="rank"):
        cfg.method_config(hidden_size=128)
