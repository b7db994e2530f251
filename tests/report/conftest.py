"""A real MLflow sqlite store filled with known synthetic series, shared by the report tests.

Pair ``A`` (read at tick 50, ticks 0, 5, ..., 60): dense, method, anchor_off and prf_mask with three seeds
each; seed ``k`` moves a series by ``d = k - 1`` (-1, 0, 1) times a small spread, so that every 95%
interval is narrow and every claim PASSes except the ``method_same_sampler`` one (no such runs: n/a);
``dropout`` is missing; bytes are the same in every seed (zero spread). Pair ``B`` (no ``read_at`` tag)
has only score and log-prob correlation: dense and method with three seeds, a method that lags dense
(claim 2 MISS), ``method_same_sampler`` with two seeds whose correlations 0.45 and 0.55 straddle 0.99
(claim 10 INCONCLUSIVE), ``anchor_off`` with one seed (claim 3 INCONCLUSIVE: n=1, no interval), no KL and
no evaluations. Pair ``A`` also has the six asynchronous conditions (``ASYNC_A``, three seeds each; val/acc,
the effective token fraction and verl's rollout_corr read-outs): claim 13 PASSes (method_async keeps 20% of
its tokens and gains 0.05 against dense_async's 0.21), claim 14 PASSes by method_async_icepop alone (0.02
below dense_async; tis 0.11 and seq_rs 0.18 below), claim 15 PASSes (dense_async_tis 0.005 above
dense_async in every seed).
"""

from __future__ import annotations

import time

import pytest

from commrl import tracking

TICKS = list(range(0, 61, 5))
VAL_TICKS = (0, 25, 50)
SEEDS_A = (0, 1, 2)
SEEDS_B = {"dense": (0, 1, 2), "method": (0, 1, 2), "method_same_sampler": (0, 1), "anchor_off": (0,)}
METHOD_SHIFT = {0: -0.01, 1: 0.01, 2: 0.0}  # the method's score and val/acc offset per seed


def line(a: float, b: float, ticks=TICKS) -> dict[int, float]:
    """``a + b * t`` at each tick."""
    return {t: a + b * t for t in ticks}


def const(value: float, ticks=TICKS) -> dict[int, float]:
    return {t: value for t in ticks}


def pair_a_series(condition: str, seed: int) -> dict[str, dict[int, float]]:
    d = seed - 1
    shift = METHOD_SHIFT[seed] if condition == "method" else 0.0
    score = {
        "dense": line(0.3, 0.008 + 0.0002 * d),
        "method": line(0.3 + shift, 0.008 + 0.0002 * d),
        "anchor_off": line(0.34, 0.0005 * d),
        "prf_mask": line(0.3, 0.007),
    }[condition]
    kl = {  # seed means: 0.0002 t, 0.02 t, 0.05 t, 0.002 t
        "dense": line(0, 0.0002 * (1 + 0.1 * d)),
        "method": line(0, 0.02 * (1 - 0.1 * d)),
        "anchor_off": line(0, 0.05),
        "prf_mask": line(0, 0.002 * (1 + 0.1 * d)),
    }[condition]
    dense_like = condition == "dense"
    val = {
        "dense": [0.45, 0.63, 0.67 + 0.005 * d],
        "method": [0.45, 0.61 + shift, 0.68 + shift],
        "anchor_off": [0.45, 0.44, 0.43],
        "prf_mask": [0.45, 0.60, 0.69],
    }[condition]
    return {
        "score/mean": score,
        "actor/kl_loss": kl,
        "actor/pg_clipfrac": line(0.0, 0.001 * (1 + 0.1 * d)),
        "actor/ppo_kl": line(0.0, 0.0005),
        "mismatch/logprob_corr": const(0.999 + 0.0002 * d if dense_like else 0.15 + 0.01 * d),
        "mismatch/prob_gap": const(0.002 * (1 + 0.1 * d) if dense_like else 0.8 + 0.01 * d),
        "mismatch/async_clip_frac_eps0.2": const(0.005 + 0.0005 * d if dense_like else 0.7 + 0.01 * d),
        "mismatch/async_clip_frac_5x": const(0.001 if dense_like else 0.61),
        "comm/bytes_total": const(1000.0 if dense_like else 100.0),
        "comm/bytes_cumulative": {t: (1000.0 if dense_like else 100.0) * (t + 1) for t in TICKS},
        "comm/ratio_vs_dense": const(1.0 if dense_like else 0.1),
        "val/acc": dict(zip(VAL_TICKS, val, strict=True)),
        **(network_series(condition, seed) if condition in NETWORK_BYTES else {}),
    }


# condition -> (val/acc at ticks VAL_TICKS, effective token frac, rollout_corr/kl); seed k adds
# 0.005 (k - 1) to the last val read (0.004 for icepop: its gap to dense_async spreads), 0.01 (k - 1) to the
# fraction and the KL
ASYNC_A = {
    "dense_async": ((0.45, 0.60, 0.66), 0.95, 0.01),
    "method_async": ((0.45, 0.47, 0.50), 0.20, 0.5),
    "method_async_tis": ((0.45, 0.50, 0.55), 0.90, 0.5),
    "method_async_icepop": ((0.45, 0.58, 0.64), 0.70, 0.5),
    "method_async_seq_rs": ((0.45, 0.46, 0.48), 0.40, 0.5),
    "dense_async_tis": ((0.45, 0.60, 0.665), 0.94, 0.01),
}


def async_series(condition: str, seed: int) -> dict[str, dict[int, float]]:
    d = seed - 1
    val, frac, kl = ASYNC_A[condition]
    last = val[-1] + (0.004 if condition == "method_async_icepop" else 0.005) * d
    series = {
        "score/mean": line(0.3, 0.005),
        "val/acc": dict(zip(VAL_TICKS, (*val[:-1], last), strict=True)),
        "actor/effective_token_frac": const(frac + 0.01 * d),
        "rollout_corr/kl": const(kl + 0.01 * d),
        "rollout_corr/k3_kl": const(kl / 2),
        "rollout_corr/chi2_token": const(2 * kl),
    }
    if condition in ("method_async_tis", "method_async_icepop", "dense_async_tis"):
        series["rollout_corr/rollout_is_eff_sample_size"] = const(0.6)
    if condition == "method_async_seq_rs":
        series["rollout_corr/rollout_rs_seq_masked_fraction"] = const(0.3 + 0.01 * d)
    return series


# commrl.netmodel's inputs, at a scale where communication matters (independent of comm/bytes_total
# above): condition -> (activations, weights) bytes per tick; the method's basis refresh on ticks 0, 20, 40,
# 60; train and sample seconds per tick.
NETWORK_BYTES = {"dense": (8e8, 2e8), "method": (8e7, 2e7)}
BASIS_BYTES, TRAIN_S, SAMPLE_S = 5e6, 0.5, 0.2


def network_series(condition: str, seed: int) -> dict[str, dict[int, float]]:
    """``comm/bytes_activations`` (basis included), ``comm/bytes_basis_refresh``, ``comm/bytes_weights``
    and ``time/train_s`` (dense ``TRAIN_S``, the method 10% more; seed ``k`` adds ``0.01 (k - 1)``),
    ``time/sample_s``: constant per tick, the same in every seed but for the train time."""
    activations, weights = NETWORK_BYTES[condition]
    basis = {t: (BASIS_BYTES if condition == "method" and t % 20 == 0 else 0.0) for t in TICKS}
    train = TRAIN_S * (1.1 if condition == "method" else 1.0) + 0.01 * (seed - 1)
    return {
        "comm/bytes_activations": {t: activations + b for t, b in basis.items()},
        "comm/bytes_basis_refresh": basis,
        "comm/bytes_weights": const(weights),
        "time/train_s": const(train),
        "time/sample_s": const(SAMPLE_S),
    }


def pair_b_series(condition: str, seed: int) -> dict[str, dict[int, float]]:
    ticks = list(range(0, 31, 5))
    d = seed - 1
    score = {
        "dense": line(0.3, 0.01 + 0.0005 * d, ticks),
        "method": line(0.3, 0.002 + 0.0002 * d, ticks),
        "method_same_sampler": line(0.3, 0.01, ticks),
        "anchor_off": const(0.3, ticks),
    }[condition]
    corr = {
        "dense": 0.999 + 0.0002 * d,
        "method": 0.2 + 0.01 * d,
        "method_same_sampler": 0.45 + 0.1 * seed,  # 0.45, 0.55
        "anchor_off": 0.3,
    }[condition]
    return {"score/mean": score, "mismatch/logprob_corr": const(corr, ticks)}


EVALS_A = {  # condition -> benchmark -> metric -> seed mean; seed k logs mean + 0.01 (k - 1)
    "dense": {
        "commrl_math500": {"acc": 0.674},
        "commrl_mmlu_stem": {"acc": 0.46},
        "commrl_amc23": {"acc": 0.58, "pass_at_8": 0.8},
    },
    "method": {
        "commrl_math500": {"acc": 0.68},
        "commrl_mmlu_stem": {"acc": 0.52},
        "commrl_amc23": {"acc": 0.58, "pass_at_8": 0.8},
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
    for condition in ("dense", "method", "anchor_off", "prf_mask"):
        for seed in SEEDS_A:
            series = pair_a_series(condition, seed)
            run_id = train_run(client, exp_a, "A", condition, seed, series, read_at=50)
            first_dense = first_dense or (run_id if condition == "dense" else "")
            for benchmark, metrics in EVALS_A.get(condition, {}).items():
                tags = {
                    "kind": "eval",
                    "benchmark": benchmark,
                    "mlflow.parentRunId": run_id,
                    "training_run_id": run_id,
                }
                ev = client.create_run(exp_a, run_name=f"eval/{benchmark}", tags=tags)
                values = {f"eval/{benchmark}/{k}": {50: v + 0.01 * (seed - 1)} for k, v in metrics.items()}
                log_series(client, ev.info.run_id, values)
                client.set_terminated(ev.info.run_id, "FINISHED")
    for condition in ASYNC_A:
        for seed in SEEDS_A:
            train_run(client, exp_a, "A", condition, seed, async_series(condition, seed), read_at=50)
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
    for condition, seeds in SEEDS_B.items():
        for seed in seeds:
            train_run(client, exp_b, "B", condition, seed, pair_b_series(condition, seed), read_at=None)


def fill_sweep_as_commrl_sweep_logs_it(client, exp_id: str) -> None:
    """``commrl.sweep``'s convention: ``read_at`` a param of the parent, searched values in tags
    ``optuna.params.<name>``, the objective ``val/acc`` at ``read_at`` (no ``objective`` metric), the
    training seed in tag ``seed``; trials 1 and 2 tie, and trial 2 started first (a retry's order)."""
    sweep = client.create_run(exp_id, run_name="sweep/A-study", tags={"kind": "sweep"})
    client.log_param(sweep.info.run_id, "read_at", 50)
    for number, (rank, val_at_50) in ((0, (8, 0.61)), (2, (16, 0.66)), (1, (32, 0.66))):
        trial = client.create_run(
            exp_id,
            run_name=f"A/A-study/trial{number:04d}",
            tags={
                "kind": "trial",
                "mlflow.parentRunId": sweep.info.run_id,
                "optuna.state": "COMPLETE",
                "optuna.trial": str(number),
                "seed": "0",
                "optuna.params.rank": str(rank),
                "optuna.params.alpha": "0.25",
            },
        )
        log_series(client, trial.info.run_id, {"val/acc": {0: 0.45, 25: 0.7, 50: val_at_50}})
        client.set_terminated(trial.info.run_id, "FINISHED")
    client.set_terminated(sweep.info.run_id, "FINISHED")


@pytest.fixture
def log_train_run():
    """``train_run``, for a test that fills a store of its own (a fixture: test modules do not import
    ``conftest``, whose module name other test folders share)."""
    return train_run


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
