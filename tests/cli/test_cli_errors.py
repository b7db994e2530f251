"""Every command prints a bad setting the same way: ``commrl <command>: error: <message>`` on stderr, the
field path named once, no traceback, exit 2 (``commrl.cli.main``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from commrl.cli.main import EXIT_USAGE, main

REPO = Path(__file__).resolve().parents[2]


def _config_error(capsys, argv: list[str], field: str) -> str:
    """Run ``commrl argv``; check the one shape of a configuration error naming ``field`` once."""
    assert main(argv) == EXIT_USAGE
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()[-1]
    assert err.startswith(f"commrl {argv[0]}: error: "), captured.err
    assert err.count(field) == 1, err
    assert "Traceback" not in captured.err and "error" not in captured.out
    return err


@pytest.mark.parametrize(
    ("override", "field", "says"),
    [
        ("method.alpha=2", "method.alpha=2", "must be in [0, 1]"),
        ("rl.ticks=x", "rl.ticks='x'", "must be an integer"),
        ("rl.tickz=3", "rl.tickz", "allowed under rl: "),
    ],
)
def test_train(capsys, tmp_path, override, field, says):
    err = _config_error(capsys, ["train", override, f"out_dir={tmp_path / 'run'}"], field)
    assert says in err
    assert not (tmp_path / "run").exists()


def test_verl_train_dry_run(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COMMRL_RESULTS", str(tmp_path))
    argv = ["verl-train", "--pair", "A", "--condition", "method", "--seed", "0", "--out", str(tmp_path / "x")]
    err = _config_error(capsys, [*argv, "--dry-run", "method.alpha=2"], "method.alpha=2")
    assert err.endswith("method.alpha=2 is invalid: must be in [0, 1] (1 = no sign correction)")


def test_sweep_with_a_bad_config_file(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COMMRL_RESULTS", str(tmp_path))
    raw = yaml.safe_load((REPO / "configs" / "sweep" / "tiny.yaml").read_text())
    raw["storage"] = f"sqlite:///{tmp_path / 'optuna.db'}"
    raw["space"]["alpha"]["high"] = 2.0
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(raw))
    err = _config_error(capsys, ["sweep", "init", "--config", str(config)], "space.alpha.high")
    assert f"{config}: space.alpha.high=2.0 is out of range" in err
    assert not (tmp_path / "optuna.db").exists()


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--pair", "Z"], "pair 'Z'"),
        (["--limit", "0"], "limit=0"),
        (["--config", "dtype.yaml"], "eval.dtype='int3'"),
    ],
)
def test_eval_with_a_bad_pair_or_setting(capsys, tmp_path, monkeypatch, extra, field):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # a model directory to the runner's check
    (tmp_path / "dtype.yaml").write_text("dtype: int3\n")
    argv = ["eval", "--checkpoint", str(tmp_path / "model"), "--benchmark", "toy_greedy", *extra]
    _config_error(capsys, argv, field)


def test_netmodel_with_a_bad_value(capsys, tmp_path):
    argv = ["netmodel", "--pair", "A", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}", "--stages", "0"]
    err = _config_error(capsys, argv, "layout.stages")
    assert "error: --stages: layout.stages=0 is invalid" in err
