"""A real MLflow sqlite store filled with known synthetic series, shared by the report tests.

Pair ``A`` (read at tick 50, ticks 0, 5, ..., 60) is designed so that every claim passes except the
``method_same_sampler`` one (no such runs: n/a); ``dropout`` is missing. Pair ``B`` (no ``read_at`` tag)
has only score and log-prob correlation, a method that lags dense (claim 2 MISS), a
``method_same_sampler`` run whose correlation is low (claim 10 MISS), no KL and no evaluations.
"""

from __future__ import annotations

import time

import pytest

from commrl import tracking

TICKS = list(range(0, 61, 5))
VAL_TICKS = (0, 25, 50)


def line(a: float, b: float, ticks=TICKS) -> dict[int, float]:
    """``a + b * t`` at each tick."""
    return {t: a + b * t for t in ticks}


def const(value: float, ticks=TICKS) -> dict[int, float]:
    return {t: value for t in ticks}


def pair_a_series(condition: str, seed: int) -> dict[str, dict[int, float]]:
    shift = {0: -0.01, 1: 0.01}[seed] if condition == "method" else 0.0
    score = {
        "dense": line(0.3, 0.008),
        "method": line(0.3 + shift, 0.008),
        "anchor_off": const(0.34),
        "prf_mask": line(0.3, 0.007),
    }[condition]
    kl = {
        "dense": line(0, 0.0002),
        "method": line(0, 0.02),
        "anchor_off": line(0, 0.05),
        "prf_mask": line(0, 0.002),
    }[condition]
    dense_like = condition == "dense"
    val = {
        "dense": [0.45, 0.63, 0.67],
        "method": [0.45, 0.61 + shift, 0.68 + shift],
        "anchor_off": [0.45, 0.44, 0.43],
        "prf_mask": [0.45, 0.60, 0.69],
    }[condition]
    return {
        "score/mean": score,
        "actor/kl_loss": kl,
        "actor/pg_clipfrac": line(0.0, 0.001),
        "actor/ppo_kl": line(0.0, 0.0005),
        "mismatch/logprob_corr": const(0.999 if dense_like else 0.15),
        "mismatch/prob_gap": const(0.002 if dense_like else 0.8),
        "mismatch/async_clip_frac_eps0.2": const(0.005 if dense_like else 0.7),
        "mismatch/async_clip_frac_5x": const(0.001 if dense_like else 0.61),
        "comm/bytes_total": const(1000.0 if dense_like else 100.0),
        "comm/bytes_cumulative": {t: (1000.0 if dense_like else 100.0) * (t + 1) for t in TICKS},
        "comm/ratio_vs_dense": const(1.0 if dense_like else 0.1),
        "val/acc": dict(zip(VAL_TICKS, val, strict=True)),
    }


def pair_b_series(condition: str) -> dict[str, dict[int, float]]:
    ticks = list(range(0, 31, 5))
    score = {
        "dense": line(0.3, 0.01, ticks),
        "method": line(0.3, 0.002, ticks),
        "method_same_sampler": line(0.3, 0.01, ticks),
    }[condition]
    corr = {"dense": 0.999, "method": 0.2, "method_same_sampler": 0.5}[condition]
    return {"score/mean": score, "mismatch/logprob_corr": const(corr, ticks)}


EVALS_A = {  # (condition, seed) -> benchmark -> metrics
    ("dense", 0): {
        "commrl_math500": {"acc": 0.674},
        "mmlu_stem": {"acc": 0.46},
        "commrl_amc23": {"acc": 0.58, "pass_at_8": 0.8},
    },
    ("method", 0): {
        "commrl_math500": {"acc": 0.67},
        "mmlu_stem": {"acc": 0.50},
        "commrl_amc23": {"acc": 0.56, "pass_at_8": 0.78},
    },
    ("method", 1): {
        "commrl_math500": {"acc": 0.69},
        "mmlu_stem": {"acc": 0.54},
        "commrl_amc23": {"acc": 0.60, "pass_at_8": 0.82},
    },
}


def log_series(client, run_id: str, series: dict[str, dict[int, float]]) -> None:
    """Every point of every metric in one ``log_batch`` (under MLflow's 1000-metric limit)."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, int(t)) for k, points in series.items() for t, v in points.items()]
    assert len(metrics) <= 1000
    client.log_batch(run_id, metrics=metrics)


def train_run(client, exp_id: str, pair: str, condition: str, seed: int, series, read_at: int | None) -> str:
    tags = {
        "kind": "train",
        "pair": pair,
        "condition": condition,
        "seed": str(seed),
        "driver": "local",
        "codec": {"dense": "identity", "prf_mask": "prf_mask"}.get(condition, "lowrank"),
        "ticks": str(max(series["score/mean"])),
    }
    if read_at is not None:
        tags["read_at"] = str(read_at)
    run = client.create_run(exp_id, run_name=tracking.training_run_name(pair, condition, seed), tags=tags)
    log_series(client, run.info.run_id, series)
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def fill_store(uri: str) -> None:
    client = tracking.client(uri)
    exp_a = tracking.ensure_experiment(tracking.experiment_name("A"), uri, client)
    first_dense = ""
    for condition, seeds in (("dense", (0,)), ("method", (0, 1)), ("anchor_off", (0,)), ("prf_mask", (0,))):
        for seed in seeds:
            series = pair_a_series(condition, seed)
            run_id = train_run(client, exp_a, "A", condition, seed, series, read_at=50)
            first_dense = run_id if condition == "dense" else first_dense
            for benchmark, metrics in EVALS_A.get((condition, seed), {}).items():
                tags = {
                    "kind": "eval",
                    "benchmark": benchmark,
                    "mlflow.parentRunId": run_id,
                    "training_run_id": run_id,
                }
                ev = client.create_run(exp_a, run_name=f"eval/{benchmark}", tags=tags)
                values = {f"eval/{benchmark}/{k}": {50: v} for k, v in metrics.items()}
                log_series(client, ev.info.run_id, values)
                client.set_terminated(ev.info.run_id, "FINISHED")
    sweep = client.create_run(exp_a, run_name="sweep-A", tags={"kind": "sweep", "direction": "maximize"})
    for i, (state, objective) in enumerate((("COMPLETE", 0.5), ("COMPLETE", 0.6), ("PRUNED", 0.9))):
        trial = client.create_run(
            exp_a,
            run_name=f"trial-{i:04d}",
            tags={"kind": "trial", "mlflow.parentRunId": sweep.info.run_id, "optuna.state": state},
        )
        for name, value in {"rank": 8 * (i + 1), "alpha": 0.25, "beta": 0.25, "cadence": 20}.items():
            client.log_param(trial.info.run_id, name, value)
        log_series(client, trial.info.run_id, {"objective": {0: objective}})
        client.set_terminated(trial.info.run_id, "FINISHED")
    client.set_terminated(sweep.info.run_id, "FINISHED")
    fill_sweep_as_commrl_sweep_logs_it(client, exp_a)
    failed_eval = client.create_run(
        exp_a,
        run_name="eval/commrl_math500",
        tags={
            "kind": "eval",
            "benchmark": "commrl_math500",
            "mlflow.parentRunId": first_dense,
            "training_run_id": first_dense,
        },
    )
    client.set_terminated(failed_eval.info.run_id, "FAILED")  # newer than the good one: must not shadow it

    exp_b = tracking.ensure_experiment(tracking.experiment_name("B"), uri, client)
    for condition in ("dense", "method", "method_same_sampler"):
        train_run(client, exp_b, "B", condition, 0, pair_b_series(condition), read_at=None)


def fill_sweep_as_commrl_sweep_logs_it(client, exp_id: str) -> None:
    """``commrl.sweep``'s convention: ``read_at`` a param of the parent, searched values in tags
    ``optuna.params.<name>``, the objective ``val/acc`` at ``read_at`` (no ``objective`` metric)."""
    sweep = client.create_run(exp_id, run_name="sweep/A-study", tags={"kind": "sweep"})
    client.log_param(sweep.info.run_id, "read_at", 50)
    for number, (rank, val_at_50) in enumerate(((8, 0.61), (32, 0.66))):
        trial = client.create_run(
            exp_id,
            run_name=f"A/A-study/trial{number:04d}",
            tags={
                "kind": "trial",
                "mlflow.parentRunId": sweep.info.run_id,
                "optuna.state": "COMPLETE",
                "optuna.trial": str(number),
                "optuna.params.rank": str(rank),
                "optuna.params.alpha": "0.25",
            },
        )
        log_series(client, trial.info.run_id, {"val/acc": {0: 0.45, 25: 0.7, 50: val_at_50}})
        client.set_terminated(trial.info.run_id, "FINISHED")
    client.set_terminated(sweep.info.run_id, "FINISHED")


@pytest.fixture(scope="session")
def store_uri(tmp_path_factory) -> str:
    """The URI of a filled sqlite store (created once per session)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    tracking.init_store(tracking_uri=uri)
    fill_store(uri)
    return uri


@pytest.fixture(scope="session")
def built(store_uri, tmp_path_factory):
    """The report of pairs A and B, built once."""
    from commrl.report import build_report

    return build_report(["A", "B"], tmp_path_factory.mktemp("out") / "report", tracking_uri=store_uri)
