"""The paper configs (configs/verl/) resolved through verl's own Hydra tree, diffed with docs/method.md §5."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from commrl import config_tree
from commrl.compression import MethodConfig
from commrl.errors import ConfigError
from commrl.rl.config import compose_train_config
from commrl.verl_ext import config as vc

REPO = Path(__file__).resolve().parents[2]
HUB_IDS = {
    "Qwen2.5-Math-1.5B": "Qwen/Qwen2.5-Math-1.5B",
    "DeepSeek-R1-Distill-Qwen-1.5B": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
}
CODECS = {  # method.md §5 "Conditions" in MethodConfig terms
    "dense": dict(codec="identity", anchor=False),
    "method": dict(codec="lowrank", grad_codec="powersgd", anchor=True, projection="secant"),
    "no_projection": dict(codec="lowrank", grad_codec="powersgd", anchor=True, projection="none"),
    "anchor_off": dict(codec="lowrank", grad_codec="powersgd", anchor=False),
    "prf_mask": dict(codec="prf_mask", grad_codec="powersgd", anchor=True, projection="secant"),
    "dropout": dict(codec="identity", grad_codec="none", anchor=False),
    # the control beyond method.md §5: the method whose fast ticks take no optimizer step
    "anchor_only": dict(
        codec="lowrank", grad_codec="powersgd", anchor=True, projection="secant", fast_step=False
    ),
}
CONDITIONS = tuple(CODECS)  # the paper matrix (configs/pipeline/paper.yaml)


def method_md() -> dict:
    """The numbers of method.md §5 (and the validation cadence and KL runs of §6), parsed from the text."""
    text = (REPO / "docs" / "method.md").read_text()
    pairs = {}
    for row in re.findall(r"^\| ([AB]) \|(.+)\|\s*$", text, flags=re.M):
        cells = [c.strip() for c in row[1].split("|")]
        model, batch_n, lengths, ticks, read_at = cells[0], cells[3], cells[4], cells[5], cells[6]
        batch, n = (int(x) for x in re.fullmatch(r"(\d+) x (\d+)", batch_n).groups())
        prompt, response = (int(x) for x in re.fullmatch(r"(\d+) / (\d+)", lengths).groups())
        ticks_m = re.fullmatch(r"(\d+)(?: \((\d+) for the KL runs\))?", ticks)
        pairs[row[0]] = dict(
            model=model,
            batch=batch,
            n=n,
            prompt=prompt,
            response=response,
            ticks=int(ticks_m[1]),
            kl_ticks=int(ticks_m[2]) if ticks_m[2] else None,
            read_at=int(read_at),
        )
    knobs = re.search(r"rank\s+(\d+),\s+K\s+=\s+h\s+=\s+(\d+),\s+alpha\s+=\s+beta\s+=\s+([\d.]+)", text)
    kl = re.search(r"KL\s+per\s+tick\s+to\s+(\d+)\s+\(([^)]*)\)", text)
    return dict(
        pairs=pairs,
        rank=int(knobs[1]),
        cadence=int(knobs[2]),
        alpha_beta=float(knobs[3]),
        val_every=int(re.search(r"validation\s+accuracy\s+every\s+(\d+)\s+ticks", text)[1]),
        kl_conditions=[c.strip() for c in kl[2].split(",")],
    )


def resolve(pair: str, condition: str, extra=(), commrl=()):
    spec = vc.compose_run(pair, condition, 0, commrl)
    overrides = vc.run_overrides(
        spec, Path("/runs/x"), Path("/data"), tracking_uri="sqlite:///m.db", extra=extra
    )
    return spec, vc.compose_verl_config(overrides)


def test_method_md_parses():
    """The parser finds both pairs of the table (else the diff below would check nothing)."""
    spec = method_md()
    assert set(spec["pairs"]) == {"A", "B"}
    assert spec["pairs"]["A"]["kl_ticks"] == 150 and spec["kl_conditions"] == [
        "dense",
        "method",
        "dropout",
        "prf_mask",
    ]


@pytest.mark.parametrize("pair", ["A", "B"])
def test_paper_configs_match_method_md(pair):
    """Every condition of the pair, resolved into verl's config, field by field against method.md §5."""
    spec_md = method_md()
    want = spec_md["pairs"][pair]
    for condition in CONDITIONS:
        spec, cfg = resolve(pair, condition)
        where = f"{pair}/{condition}"
        arr = cfg.actor_rollout_ref
        assert cfg.data.train_batch_size == want["batch"], where
        assert arr.rollout.n == want["n"], where
        assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (
            want["prompt"],
            want["response"],
        ), where
        ticks = (
            want["kl_ticks"] if want["kl_ticks"] and condition in spec_md["kl_conditions"] else want["ticks"]
        )
        assert cfg.trainer.total_training_steps == ticks, where
        assert cfg.trainer.test_freq == spec_md["val_every"] and cfg.trainer.val_before_train, where
        assert spec.read_at == want["read_at"], where
        assert arr.model.path == HUB_IDS[want["model"]], where
        # one tick = one GRPO update = one optimizer step
        assert arr.actor.ppo_mini_batch_size == cfg.data.train_batch_size and arr.actor.ppo_epochs == 1, where
        assert cfg.algorithm.adv_estimator == "grpo" and arr.actor.use_kl_loss, where
        assert arr.actor.kl_loss_type == "low_var_kl" and arr.actor.strategy == "fsdp2", where
        method = vc.method_from_env(dict(cfg.ray_kwargs.ray_init.runtime_env.env_vars))
        assert method.rank == spec_md["rank"] and method.cadence == spec_md["cadence"], where
        assert method.effective_delay() == spec_md["cadence"], where
        assert method.alpha == method.beta == spec_md["alpha_beta"], where
        for field, value in CODECS[condition].items():
            assert getattr(method, field) == value, (where, field)
        dropout = arr.model.override_config.get("attention_dropout", 0.0)
        assert (dropout > 0) == (condition == "dropout"), where


def test_driver_keys_are_set():
    """MLflow naming, the engine, the reward, the legacy trainer, the checkpoint folder and data files."""
    _spec, cfg = resolve("A", "method")
    assert list(cfg.trainer.logger) == ["console", "mlflow"]
    assert (cfg.trainer.project_name, cfg.trainer.experiment_name) == ("commrl/A", "A/method/seed0")
    assert cfg.actor_rollout_ref.model.external_lib == "commrl.verl_ext"
    assert Path(cfg.reward.custom_reward_function.path) == REPO / "src" / "commrl" / "rl" / "reward.py"
    assert cfg.reward.custom_reward_function.name == "compute_score"
    assert cfg.trainer.use_v1 is False
    assert cfg.trainer.default_local_dir == "/runs/x/checkpoints"
    assert (cfg.data.train_files, cfg.data.val_files) == (
        "/data/math/train.parquet",
        "/data/math500/test.parquet",
    )
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_TRACKING_URI == "sqlite:///m.db"
    vc.check_verl_config(cfg)  # verl's own validate_config accepts the paper config


def test_overrides_route_to_commrl_or_verl_and_win():
    """method.* goes to commrl's tree, everything else to verl's; both beat the paper config."""
    commrl, verl = vc.split_overrides(
        ["method.cadence=10", "trainer.total_training_steps=7", "+x.y=1", "model.path=/m"]
    )
    assert commrl == ["method.cadence=10", "model.path=/m"] and verl == [
        "trainer.total_training_steps=7",
        "+x.y=1",
    ]
    _spec, cfg = resolve(
        "B", "method", extra=["trainer.total_training_steps=7"], commrl=["method.cadence=10", "model.path=/m"]
    )
    assert cfg.trainer.total_training_steps == 7 and cfg.actor_rollout_ref.model.path == "/m"
    assert vc.method_from_env(dict(cfg.ray_kwargs.ray_init.runtime_env.env_vars)).cadence == 10


def test_commrl_keys_are_not_verl_keys():
    """The routing by first key is unambiguous: none of commrl's top-level keys exists in verl's config."""
    _, cfg = resolve("A", "dense")
    assert not set(vc.COMMRL_KEYS) & set(cfg.keys())


def test_the_paper_matrix_is_what_the_pipeline_runs():
    """The conditions checked above are those configs/pipeline/paper.yaml trains, anchor_only included."""
    paper = yaml.safe_load((REPO / "configs" / "pipeline" / "paper.yaml").read_text())
    assert {p: set(c["conditions"]) for p, c in paper["pairs"].items()} == {
        "A": set(CODECS),
        "B": set(CODECS),
    }


def _trees(tmp_path: Path) -> tuple[Path, Path]:
    """Copies of configs/train, configs/verl and their shared configs/condition."""
    for name in ("train", "verl", "condition"):
        shutil.copytree(REPO / "configs" / name, tmp_path / name)
    return tmp_path / "train", tmp_path / "verl"


def test_both_drivers_read_each_condition_from_its_one_file(tmp_path):
    """A change to configs/condition/<c>.yaml reaches both drivers; nothing else defines a condition."""
    train, verl = _trees(tmp_path)
    path = tmp_path / "condition" / "prf_mask.yaml"
    spec = yaml.safe_load(path.read_text())
    spec["method"]["projection"] = "quad4"
    spec["model"] = {"attention_dropout": 0.05}
    path.write_text("# @package _global_\n" + yaml.safe_dump(spec))
    local = compose_train_config(["condition=prf_mask"], train)
    run = vc.compose_run("A", "prf_mask", 0, config_dir=verl)
    assert local["method"]["projection"] == run.method.projection == "quad4"
    assert local["model"]["attention_dropout"] == run.attention_dropout == 0.05
    assert not list(train.glob("**/prf_mask.yaml")) and not list(verl.glob("**/prf_mask.yaml"))


@pytest.mark.parametrize("condition", config_tree.known_conditions(REPO / "configs" / "verl", "verl"))
def test_every_condition_the_verl_driver_runs_composes_from_its_file(condition):
    spec = yaml.safe_load((REPO / "configs" / "condition" / f"{condition}.yaml").read_text())
    run = vc.compose_run("B", condition, 0)
    assert run.condition == condition
    for field, value in spec["method"].items():
        assert getattr(run.method, field) == value, field
    assert run.attention_dropout == spec.get("model", {}).get("attention_dropout", 0.0)


def test_attention_dropout_is_one_field_for_both_drivers():
    """model.attention_dropout: the dropout condition's 0.1, and a command-line value on any condition."""
    assert vc.compose_run("A", "dropout", 0).attention_dropout == 0.1
    assert vc.split_overrides(["model.attention_dropout=0.2"])[0] == ["model.attention_dropout=0.2"]
    _, cfg = resolve("A", "dense", commrl=["model.attention_dropout=0.2"])
    assert cfg.actor_rollout_ref.model.override_config.attention_dropout == 0.2
    assert (
        compose_train_config(["condition=dense", "model.attention_dropout=0.2"])["model"]["attention_dropout"]
        == 0.2
    )


def test_the_verl_driver_rejects_a_local_only_condition_saying_why():
    with pytest.raises(ConfigError) as err:
        vc.compose_run("A", "method_same_sampler", 0)
    message = str(err.value)
    assert (
        "condition 'method_same_sampler' does not run on the verl driver: its sampler runs the trainer's"
        in message
    )
    assert "stock vLLM" in message and message.endswith("run it with `commrl train`")


def test_command_line_ticks_win_over_ticks_by_condition():
    """Defect 7: pair A's ticks_by_condition (dense 150) used to override `ticks=7` silently."""
    assert vc.compose_run("A", "dense", 0, ["ticks=7", "read_at=7"]).ticks == 7
    assert vc.compose_run("A", "dense", 0, ["++ticks=7", "read_at=7"]).ticks == 7
    assert vc.compose_run("A", "dense", 0).ticks == 150
    assert vc.compose_run("A", "no_projection", 0).ticks == 100
    assert vc.compose_run("A", "dense", 0, ["ticks_by_condition.dense=120"]).ticks == 120
    _, cfg = resolve("A", "method", commrl=["ticks=7", "read_at=7"])
    assert cfg.trainer.total_training_steps == 7


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (dict(pair="C", condition="method"), "--pair 'C' has no config"),
        (
            dict(pair="A", condition="nope"),
            "choose one of anchor_off, anchor_only, dense, dropout, method, no_projection",
        ),
        (dict(pair="A", condition="method", commrl=["method.rank=0"]), "method.rank=0 is invalid"),
        (dict(pair="A", condition="method", commrl=["method.kind=x"]), "Could not override 'method.kind'"),
        (  # verl ignores the loss type in decoupled mode: refused as the local driver refuses it
            dict(pair="A", condition="method", commrl=["rl.rollout_correction.loss_type=reinforce"]),
            "loss_type='reinforce' is invalid with rl.behaviour_logprobs=trainer",
        ),
    ],
)
def test_bad_run_settings_are_named(args, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        vc.compose_run(args["pair"], args["condition"], 0, args.get("commrl", ()))


def test_unknown_verl_key_is_named():
    with pytest.raises(ConfigError, match=r"verl rejected an override.*trainer.no_such_key"):
        resolve("A", "method", extra=["trainer.no_such_key=1"])


def test_method_env_round_trip_and_errors():
    cfg = MethodConfig(codec="prf_mask", rank=16, cadence=5, seed=3)
    assert vc.method_from_env({vc.METHOD_ENV: vc.method_to_env(cfg)}) == cfg
    assert vc.method_from_env({}) is None
    with pytest.raises(ConfigError, match="COMMRL_METHOD is not valid JSON"):
        vc.method_from_env({vc.METHOD_ENV: "{codec"})


def test_hydra_value_survives_compose():
    """Strings with quotes, braces and commas (the JSON env var) come back unchanged through Hydra."""
    value = '{"a": "it\'s", "b": [1, 2]}'
    _, cfg = resolve(
        "A", "dense", extra=[f"+ray_kwargs.ray_init.runtime_env.env_vars.X={vc.hydra_value(value)}"]
    )
    assert value == cfg.ray_kwargs.ray_init.runtime_env.env_vars.X
    assert vc.hydra_value([1, "a", None, True]) == "[1,'a',null,true]"


@pytest.mark.parametrize(
    "value",
    ["a\\b", "C:\\dir\\f", "q'\\n", "ends\\", "x\\'y", "${oc.env:HOME}", "a$b", "\\${x}", "{{ '\\n' }}\\"],
)
def test_hydra_value_keeps_backslashes_and_interpolations_literal(value):
    """A backslash not before a quote is literal in Hydra's quoted values (doubling it doubled it), and
    OmegaConf resolves ``${...}`` even inside quotes (a chat template or a stop string came back altered)."""
    _, cfg = resolve(
        "A", "dense", extra=[f"+ray_kwargs.ray_init.runtime_env.env_vars.X={vc.hydra_value(value)}"]
    )
    assert value == cfg.ray_kwargs.ray_init.runtime_env.env_vars.X


def test_prepared_data_and_reward_load_through_verls_own_loaders(tmp_path, tiny_model_dir):
    """The paper config's data section reads `commrl prepare`'s toy parquet in verl's RLHFDataset, and verl's
    custom-reward loader finds commrl's math-verify reward, which scores a boxed right answer 1."""
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.config import omega_conf_to_dataclass

    from commrl.cli.main import main

    assert main(["prepare", "--dataset", "toy", "--seed", "0", "--out", str(tmp_path / "toy")]) == 0
    _, cfg = resolve(
        "A",
        "method",
        commrl=[f"model.path={tiny_model_dir}"],
        extra=[
            f"data.train_files={tmp_path / 'toy' / 'train.parquet'}",
            f"data.val_files={tmp_path / 'toy' / 'validation.parquet'}",
        ],
    )
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    val = create_rl_dataset(cfg.data.val_files, cfg.data, model.tokenizer, model.processor, is_train=False)
    row = val[0]
    assert row["raw_prompt"][0]["role"] == "user" and len(val) > 0
    truth = row["reward_model"]["ground_truth"]
    reward = get_custom_reward_fn(cfg)
    assert reward(row["data_source"], f"so \\boxed{{{truth}}}", truth, row["extra_info"])["score"] == 1.0
    assert reward(row["data_source"], f"so {truth}", truth, row["extra_info"])["score"] == 0.0


A = "actor_rollout_ref.actor"


@pytest.mark.parametrize(
    ("condition", "overrides", "message"),
    [
        ("method", [f"{A}.strategy=fsdp"], f"set {A}.strategy=fsdp2"),
        ("dense", [f"{A}.ulysses_sequence_parallel_size=2"], f"set {A}.ulysses_sequence_parallel_size=1"),
        ("method", [f"{A}.fsdp_config.fsdp_size=4"], f"set {A}.fsdp_config.fsdp_size=-1"),
        ("method", [f"{A}.fsdp_config.reshard_after_forward=False"], "or method.anchor=false"),
        (
            "method",
            ["actor_rollout_ref.ref.fsdp_config.fsdp_size=4"],
            "set actor_rollout_ref.ref.fsdp_config.fsdp_size=-1",
        ),
        ("method", ["actor_rollout_ref.model.lora_rank=8"], "set actor_rollout_ref.model.lora_rank=0"),
    ],
)
def test_a_layout_the_circuits_cannot_run_on_is_refused_before_ray(tmp_path, condition, overrides, message):
    """The engine's own layout checks (FSDP1, Ulysses, hybrid sharding, the anchor without resharding, LoRA,
    whose reference verl runs on the actor's engine), asked of verl's config by ``commrl verl-train`` before
    Ray starts: the same message, naming the key."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        vc.compose_verl_run("A", condition, 0, overrides, tmp_path / "run", tmp_path / "data")


@pytest.mark.parametrize(
    ("condition", "overrides"),
    [
        ("anchor_off", [f"{A}.fsdp_config.reshard_after_forward=False"]),  # nothing loaded into the shards
        ("method", ["+method.kl_ref_forward=dense", "actor_rollout_ref.ref.fsdp_config.fsdp_size=4"]),
        ("method", [f"{A}.fsdp_config.fsdp_size=8"]),  # the whole node: one shard group
    ],
)
def test_a_layout_the_circuits_do_not_touch_passes(tmp_path, condition, overrides):
    vc.compose_verl_run("A", condition, 0, overrides, tmp_path / "run", tmp_path / "data")
