"""The shipped base policy: ``commrl pretrain --shipped`` checks the checked-in output against the recipe and
the data before staging it, and the repository's ``assets/tiny-base`` is that command's output on the toy
data this project generates."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from commrl.cli.main import main
from commrl.data.files import write_dataset
from commrl.data.schema import DataError
from commrl.data.toy import ToyConfig, prepare_toy
from commrl.errors import ConfigError
from commrl.models.pretrain import ACCURACY_FILE, PretrainConfig
from commrl.models.shipped import MANIFEST, check_shipped, stage_shipped, write_manifest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "assets" / "tiny-base"


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pipeline's toy data (``commrl prepare --dataset toy --seed 0``)."""
    out = tmp_path_factory.mktemp("toy")
    write_dataset(out, prepare_toy(ToyConfig(seed=0)))
    return out


@pytest.fixture()
def made(tmp_path: Path, toy: Path) -> Path:
    """A copy of the shipped base with its manifest rewritten as `commrl pretrain` output would have it."""
    base = tmp_path / "base"
    shutil.copytree(SHIPPED, base)
    write_manifest(base, toy, "commrl pretrain --data toy --out base", {"test": True})
    return base


def test_the_shipped_base_is_intact_and_made_on_the_data_this_project_generates(toy: Path) -> None:
    manifest = check_shipped(SHIPPED, toy, PretrainConfig())
    assert manifest["config"] == asdict(PretrainConfig())
    accuracy = json.loads((SHIPPED / ACCURACY_FILE).read_text())
    assert accuracy["in_window"] and accuracy["seed"] == 0


def test_staging_copies_every_file_and_the_model_loads(made: Path, toy: Path, tmp_path: Path) -> None:
    out = tmp_path / "results" / "tiny-base"
    result = stage_shipped(made, out, toy, PretrainConfig())
    assert result == json.loads((made / ACCURACY_FILE).read_text())
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in made.iterdir()}
    assert AutoModelForCausalLM.from_pretrained(out).config.hidden_size == 128
    data_time = (toy / "train.parquet").stat().st_mtime  # newer than its inputs: no rerun by Snakemake
    assert all(p.stat().st_mtime >= data_time for p in out.iterdir())
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_another_recipe_or_other_data_is_refused_with_the_fix(made: Path, toy: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"pretrain\.seed: shipped 0, asked 1.*pairs\.<pair>\.pretrain\.shipped"
    ):
        stage_shipped(made, tmp_path / "out", toy, replace(PretrainConfig(), seed=1))
    other = tmp_path / "other"
    write_dataset(other, prepare_toy(ToyConfig(seed=1)))
    with pytest.raises(ConfigError, match=r"other data \(train\.parquet, validation\.parquet of"):
        stage_shipped(made, tmp_path / "out", other, PretrainConfig())
    assert not (tmp_path / "out").exists()


def test_a_damaged_or_missing_file_is_refused_with_the_fix(made: Path, toy: Path, tmp_path: Path) -> None:
    (made / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(DataError, match=r"model\.safetensors: missing or not the shipped file.*git checkout"):
        stage_shipped(made, tmp_path / "out", toy, PretrainConfig())
    (made / MANIFEST).unlink()
    with pytest.raises(DataError, match=r"SHIPPED\.json: no such file"):
        stage_shipped(made, tmp_path / "out", toy, PretrainConfig())
    assert not (tmp_path / "out").exists()


def test_cli_stages_the_shipped_base_and_says_so(toy: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "base"
    assert main(["pretrain", "--data", str(toy), "--out", str(out), "--shipped", str(SHIPPED)]) == 0
    assert f"base policy (shipped {SHIPPED}) -> {out}: greedy validation acc 0.474" in capsys.readouterr().out
    assert (out / "model.safetensors").read_bytes() == (SHIPPED / "model.safetensors").read_bytes()
    assert (
        main(["pretrain", "--data", str(toy), "--out", str(out), "--shipped", str(SHIPPED), "--lr", "0.1"])
        == 2
    )
    assert "pretrain.lr: shipped 0.001, asked 0.1" in capsys.readouterr().err
