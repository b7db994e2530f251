"""MethodConfig: defaults from method.md, bad values rejected with the field named, unknown keys named."""

from __future__ import annotations

import pytest

from commrl.compression import MethodConfig
from commrl.errors import ConfigError


def test_defaults_follow_method_md():
    cfg = MethodConfig()
    assert (cfg.codec, cfg.rank, cfg.grad_codec, cfg.cadence, cfg.projection) == (
        "lowrank",
        77,
        "powersgd",
        20,
        "secant",
    )
    assert (cfg.alpha, cfg.beta, cfg.projection_scale, cfg.kl_ref_forward) == (0.25, 0.25, 1.0, "codec")
    # the readings keep today's behaviour by default (method.md §2, §4)
    assert (cfg.points, cfg.sign_scope, cfg.prf_keep, cfg.fast_step, cfg.grad_cosine_every) == (
        "all",
        "all",
        None,
        True,
        1,
    )
    assert cfg.effective_delay() == 20 and cfg.effective_grad_rank() == 77
    assert cfg.keep_prob(1536) == pytest.approx(77 / 1536)
    assert MethodConfig(delay=0, grad_rank=4).effective_delay() == 0
    assert MethodConfig(grad_rank=4).effective_grad_rank() == 4
    assert MethodConfig(codec="prf_mask").keep_prob(1536) == pytest.approx(77 / 1536)  # bytes-matched
    assert MethodConfig(codec="prf_mask", prf_keep=0.5).keep_prob(1536) == 0.5


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("rank", 0, ">= 1"),
        ("alpha", 1.5, "[0, 1]"),
        ("beta", 1.0, "[0, 1)"),
        ("cadence", 0, ">= 1"),
        ("delay", -1, ">= 0"),
        ("projection", "cubic", "secant"),
        ("codec", "topk", "lowrank"),
        ("grad_codec", "signsgd", "powersgd"),
        ("prf_keep", 0.0, "(0, 1]"),
        ("prf_keep", 1.2, "(0, 1]"),
        ("grad_rank", 0, ">= 1"),
        ("relex_window", 1, ">= 2"),
        ("progressive_fires", 0, ">= 1"),
        ("min_compression_rate", 0.5, ">= 1"),
        ("kl_ref_forward", "none", "codec"),
        ("anchor", "yes", "true or false"),
        ("cadence", 2.5, "integer"),
        ("points", "every", "all, boundaries"),
        ("sign_scope", "dense", "all, compressed"),
        ("fast_step", 0, "true or false"),
        ("grad_cosine_every", -1, "integer >= 0"),
        ("grad_cosine_every", True, "1: every fire, 0: never"),
        ("grad_cosine_every", 2.5, "integer >= 0"),
        ("seed", -1, "[0, 2**32)"),
        ("seed", 2**32, "[0, 2**32)"),  # PowerSGD's numpy generator takes no larger seed
    ],
)
def test_bad_values_name_the_field(field, value, fragment):
    with pytest.raises(ConfigError) as info:
        MethodConfig(**{field: value})
    assert f"method.{field}={value!r}" in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("settings", "field", "fragment"),
    [
        ({"prf_keep": 0.5}, "prf_keep", "method.codec=prf_mask"),
        ({"sign_scope": "compressed", "grad_codec": "none"}, "sign_scope", "method.sign_scope=all"),
        ({"fast_step": False, "anchor": False}, "fast_step", "method.anchor=true"),
    ],
)
def test_settings_that_contradict_each_other_are_named(settings, field, fragment):
    with pytest.raises(ConfigError) as info:
        MethodConfig(**settings)
    assert f"method.{field}={settings[field]!r}" in str(info.value) and fragment in str(info.value)
    assert MethodConfig(codec="prf_mask", prf_keep=0.5).prf_keep == 0.5
    assert MethodConfig(sign_scope="compressed").sign_scope == "compressed"
    assert not MethodConfig(fast_step=False).fast_step


def test_rank_must_be_below_hidden_size():
    MethodConfig(rank=63).validate(hidden_size=64)
    with pytest.raises(ConfigError, match=r"method\.rank=64 .*hidden_size=64"):
        MethodConfig(rank=64).validate(hidden_size=64)


def test_from_dict_rejects_unknown_keys_by_name():
    cfg = MethodConfig.from_dict({"rank": 8, "projection": "relex"})
    assert cfg == MethodConfig(rank=8, projection="relex")
    assert MethodConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"unknown method setting.*cadense.*known settings:.*cadence"):
        MethodConfig.from_dict({"cadense": 10})
