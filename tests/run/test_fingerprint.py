"""A run's config fingerprint and the check a resume makes against it (both drivers' rules, one table)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from commrl.errors import ConfigError
from commrl.run import fingerprint

RUN = {
    "pair": "tiny",
    "out_dir": "results/runs/tiny/method/seed0",
    "threads": 2,
    "tracking": {"uri": "sqlite:///results/mlflow.db", "enabled": True},
    "checkpoint": {"every": 10, "keep": 2},
    "unsupported_drivers": {},
    "sampler": {"backend": "hf", "kv_cache_gib": 1},
    "rl": {"ticks": 40, "read_at": 40, "betas": (0.9, 0.999)},
    "method": {"projection": "secant", "rank": 6},
}


def changed(**parts) -> dict:
    """``RUN`` with the given top-level parts updated (one level deep)."""
    out = {key: dict(value) if isinstance(value, dict) else value for key, value in RUN.items()}
    for key, value in parts.items():
        if isinstance(value, dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def test_the_fingerprint_is_flat_json_without_the_exempt_keys():
    assert fingerprint.of(RUN) == {
        "pair": "tiny",
        "sampler.backend": "hf",
        "rl.ticks": 40,
        "rl.read_at": 40,
        "rl.betas": [0.9, 0.999],
        "method.projection": "secant",
        "method.rank": 6,
    }
    verl = fingerprint.of(
        {
            "verl": {
                "trainer": {"default_local_dir": "/scratch/c", "n_gpus_per_node": 8, "test_freq": 25},
                "actor_rollout_ref": {"actor": {"profiler": {"tool": None}}, "rollout": {"nnodes": 0}},
                "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {"MLFLOW_RUN_ID": "abc"}}}},
            }
        }
    )
    assert verl == {"verl.trainer.test_freq": 25}


def test_paths_tracking_resources_and_checkpoints_do_not_block_a_resume():
    now = changed(
        out_dir="/abs/results/runs/tiny/method/seed0",
        threads=0,
        tracking={"uri": "sqlite:////elsewhere/mlflow.db", "enabled": False},
        checkpoint={"every": 5, "keep": 4},
        sampler={"kv_cache_gib": 4},
    )
    fingerprint.check_resume(fingerprint.of(RUN), fingerprint.of(now), 20, [Path("run")])


def test_a_changed_method_setting_is_refused_naming_each_key_old_new_and_the_fix():
    now = fingerprint.of(changed(method={"projection": "none", "rank": 8}, sampler={"backend": "vllm"}))
    with pytest.raises(ConfigError) as refused:
        fingerprint.check_resume(fingerprint.of(RUN), now, 40, [Path("/runs/tiny/method/seed0")])
    message = str(refused.value)
    assert "/runs/tiny/method/seed0 holds a run checkpointed at tick 40" in message
    assert "method.projection: 'secant' -> 'none'" in message
    assert "method.rank: 6 -> 8" in message and "sampler.backend: 'hf' -> 'vllm'" in message
    assert "Restore these settings" in message and "move or delete /runs/tiny/method/seed0" in message


@pytest.mark.parametrize(
    ("recorded", "now", "changed"),
    [
        (
            {"verl.actor.override_config": {}},
            {"verl.actor.override_config.attn_implementation": "eager"},
            ["verl.actor.override_config: {} -> (not set)"],
        ),
        (
            {"verl.algorithm.kl_ctrl.type": "fixed", "verl.algorithm.kl_ctrl.kl_coef": 0.001},
            {"verl.algorithm.kl_ctrl": None},
            [
                "verl.algorithm.kl_ctrl.kl_coef: 0.001 -> (not set)",
                "verl.algorithm.kl_ctrl: (not set) -> None",
            ],
        ),
    ],
)
def test_a_value_turned_into_a_mapping_or_back_is_refused_not_warned(recorded, now, changed):
    """A key one side has is another version's only when the other side has nothing above or below it: an
    empty mapping filled, or a mapping set to null, is the same setting changed, so the resume is refused."""
    base = fingerprint.of(RUN)
    found = fingerprint.differences({**base, **recorded}, {**base, **now}, 10)
    assert all(line in found for line in changed)
    assert fingerprint.version_changes({**base, **recorded}, {**base, **now}) == []
    with pytest.raises(ConfigError, match="under another config"):
        fingerprint.check_resume({**base, **recorded}, {**base, **now}, 10, [Path("/runs/x")])


def test_a_key_only_one_side_has_is_another_version_warned_not_refused(capsys):
    recorded = {**fingerprint.of(RUN), "threads": 4}  # an exempt key of an older record: not listed
    now = {**fingerprint.of(RUN), "method.fast_step": False}
    del now["method.rank"]
    assert fingerprint.differences(recorded, now, 10) == []
    assert fingerprint.version_changes(recorded, now) == [
        "method.fast_step: (not set) -> False",
        "method.rank: 6 -> (not set)",
    ]
    fingerprint.check_resume(recorded, now, 10, [Path("/runs/x")])
    err = capsys.readouterr().err
    assert "another commrl or verl version" in err and "/runs/x" in err
    assert "method.fast_step: (not set) -> False" in err and "method.rank: 6 -> (not set)" in err
    now["pair"] = "A"  # a key both have still refuses, and the warning still comes
    with pytest.raises(ConfigError, match="pair: 'tiny' -> 'A'"):
        fingerprint.check_resume(recorded, now, 10, [Path("/runs/x")])
    assert "method.fast_step" in capsys.readouterr().err
    fingerprint.check_resume(fingerprint.of(RUN), fingerprint.of(RUN), 10, [Path("/runs/x")])
    assert capsys.readouterr().err == ""


def test_ticks_may_grow_but_not_fall_below_the_checkpoint():
    recorded = fingerprint.of(RUN)
    for ticks, tick in ((60, 40), (30, 20), (40, 40)):  # extend a finished run; shorten one not yet there
        assert fingerprint.differences(recorded, fingerprint.of(changed(rl={"ticks": ticks})), tick) == []
    (diff,) = fingerprint.differences(recorded, fingerprint.of(changed(rl={"ticks": 20})), 30)
    assert diff.startswith("rl.ticks: 40 -> 20 (the checkpoint is at tick 30")
    verl = {"verl.trainer.total_training_steps": 150}
    assert fingerprint.differences(verl, {"verl.trainer.total_training_steps": 300}, 150) == []
    assert fingerprint.differences(verl, {"verl.trainer.total_training_steps": 100}, 125)


def test_the_read_point_may_move_only_past_the_checkpoint():
    recorded = fingerprint.of(RUN)
    assert (
        fingerprint.differences(recorded, fingerprint.of(changed(rl={"ticks": 60, "read_at": 60})), 40) == []
    )
    (diff,) = fingerprint.differences(recorded, fingerprint.of(changed(rl={"read_at": 20})), 30)
    assert re.match(r"rl\.read_at: 40 -> 20 \(the run has trained to tick 30", diff)
    assert fingerprint.differences({"read_at": 100}, {"read_at": 50}, 75)


def test_a_key_an_older_record_had_and_is_exempt_now_is_ignored():
    assert fingerprint.differences({"threads": 4, "pair": "tiny"}, {"pair": "tiny"}, 10) == []


def test_a_checkpoint_without_a_record_resumes_with_a_warning(capsys):
    fingerprint.check_resume(None, fingerprint.of(RUN), 20, [Path("/runs/x")])
    err = capsys.readouterr().err
    assert "warning" in err and "/runs/x" in err and "no config record" in err and "unchecked" in err
