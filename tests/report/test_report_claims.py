"""Claims on in-memory pairs (``PairRuns`` of synthetic seeds): the read window, unfinished runs and the
strict claim 12. Pair ``P`` is read at tick 100, validated every 25 ticks; dense and method run on to 150
(as pair A's long KL runs do), anchor_only stops at 100."""

from __future__ import annotations

import pytest

from commrl.report import evaluate_claims
from commrl.report.runs import PairRuns, Series, TrainRun
from commrl.report.tables import best_validation, bytes_table, mismatch_table

READ_AT = 100
SEEDS = ("0", "1", "2")


def series(points: dict[int, float]) -> Series:
    return Series.from_points(list(points.items()))


def run(condition: str, seed: str, val: dict[int, float], corr: dict[int, float], status: str = "FINISHED"):
    metrics = {"val/acc": series(val), "mismatch/logprob_corr": series(corr)}
    ticks = max(val)
    return TrainRun(f"{condition}-{seed}", condition, condition, "", seed, status, READ_AT, ticks, metrics)


def pair(runs: list[TrainRun]) -> PairRuns:
    return PairRuns("P", runs, [], [])


def base_runs(anchor_only_val: float = 0.60) -> list[TrainRun]:
    """dense reads 0.70 at 100 and 0.80 at 150; method 0.62 at 100 (best up to then) and 0.90 at 150;
    method's log-prob correlation is 0.2 up to tick 100 and 0.95 after; seed i adds 0.001 i."""
    out = []
    for seed in SEEDS:
        d = 0.001 * int(seed)
        out.append(
            run("dense", seed, {0: 0.4, 50: 0.6, 100: 0.70 + d, 150: 0.80 + d}, {t: 1.0 for t in range(151)})
        )
        method_corr = {t: (0.2 if t <= READ_AT else 0.95) + d for t in range(151)}
        out.append(run("method", seed, {0: 0.4, 50: 0.5, 100: 0.62 + d, 150: 0.90 + d}, method_corr))
        out.append(run("anchor_only", seed, {0: 0.4, 50: 0.5, 100: anchor_only_val + d}, {0: 0.3}))
    return out


def claims(runs: list[TrainRun]) -> dict[int, object]:
    return {c.number: c for c in evaluate_claims(pair(runs))}


def test_best_and_means_are_read_up_to_the_read_tick():
    """Claim 11 reads val/acc at tick 100 and the best-validation table the best up to it (method 0.62 vs
    dense 0.70: a MISS), not the method's 0.90 at tick 150; claim 7 and the mismatch table average the
    correlation over ticks 0-100 (0.2), not the 0.95 logged after."""
    got = claims(base_runs())
    assert got[11].status == "MISS"
    assert got[11].values["method"] == pytest.approx(0.621) and got[11].values["method_tick"] == "100"
    assert got[7].status == "PASS" and got[7].interval.estimate == pytest.approx(0.201)
    best = {row[0]: row for row in best_validation(pair(base_runs())).rows}
    assert best["method"][3].estimate == pytest.approx(0.621) and best["method"][4].estimate == 100
    corr = {row[0]: row for row in mismatch_table(pair(base_runs())).rows}
    assert corr["method"][2].estimate == pytest.approx(0.201)


def test_a_run_that_did_not_finish_makes_its_claims_inconclusive_and_is_named():
    runs = base_runs()
    runs[1] = run("method", "0", {0: 0.4, 50: 0.72}, {t: 0.2 for t in range(51)}, status="FAILED")
    got = claims(runs)
    for number in (7, 11, 12):
        assert got[number].status == "INCONCLUSIVE"
        assert got[number].reason.startswith("method seed 0 is FAILED: a claim reads finished runs only")
        assert not got[number].checks
    assert got[6].status == "PASS"  # dense alone: every run finished


def test_a_seed_that_ended_before_the_read_tick_makes_its_claims_inconclusive_and_is_named():
    """A run stopped early (a collapse alarm ends it FINISHED at tick 50): its val/acc at 50 was paired with
    dense's at 100, seed by seed, and a verdict given."""
    runs = base_runs()
    runs[1] = run("method", "0", {0: 0.4, 50: 0.72}, {t: 0.2 for t in range(51)})
    got = claims(runs)
    for number in (11, 12):
        assert got[number].status == "INCONCLUSIVE" and not got[number].checks
        assert got[number].reason == (
            "method seed 0 ends at tick 50, before the read tick 100: a claim reads every seed at the "
            "read tick"
        )


@pytest.mark.parametrize(("anchor_only", "status"), [(0.62, "MISS"), (0.60, "PASS"), (0.64, "MISS")])
def test_claim_12_needs_the_method_strictly_above_anchor_only(anchor_only, status):
    """The same val/acc in every seed (a fast circuit that adds nothing) is a MISS of "beats", not a PASS."""
    got = claims(base_runs(anchor_only))[12]
    assert got.status == status
    if anchor_only == 0.62:
        assert got.reason == "95% CI [0, 0] <= 0"


def test_claim_11_reads_validation_at_the_read_tick_as_the_notes_figure_3_not_the_best():
    """The method peaks at 0.72 (tick 50, above dense's best 0.70) and reads 0.62 at the read tick: the
    note's Figure 3 compares the two at the step both are cut at, a MISS (a best-val reading would PASS)."""
    runs = base_runs()
    for k, r in enumerate(runs):
        if r.condition == "method":
            runs[k] = run("method", r.seed, {0: 0.4, 50: 0.72, 100: 0.62, 150: 0.9}, {0: 0.2})
    got = claims(runs)[11]
    assert got.status == "MISS" and got.decided_by.quantity == "val method - dense"
    assert got.values["method"] == pytest.approx(0.62) and got.values["method_tick"] == "100"
    assert got.threshold == "|val method - val dense| at read <= 0.05"


def _same_sampler_runs(score: dict[int, float], corr: float = 1.0) -> list[TrainRun]:
    ticks = range(0, 101, 10)
    metrics = {"score/mean": series(score), "mismatch/logprob_corr": series({t: corr for t in ticks})}
    return [
        TrainRun(
            f"s-{seed}",
            "method_same_sampler",
            "method_same_sampler",
            "",
            seed,
            "FINISHED",
            READ_AT,
            100,
            metrics,
        )
        for seed in SEEDS
    ]


def test_claim_10_needs_the_sampler_on_the_codec_to_learn_not_only_to_agree():
    """A sampler whose codec turns every rollout into a wrong answer (score 0 at every tick: every advantage
    0, the weights never move) agrees with the trainer to the last bit; the claim is then a MISS, decided by
    the score gain, not a PASS on the correlation."""
    flat = claims(_same_sampler_runs({t: 0.0 for t in range(0, 101, 10)}))[10]
    assert [c.status for c in flat.checks] == ["PASS", "MISS"]
    assert flat.status == "MISS" and flat.decided_by.quantity == "method_same_sampler score gain"
    assert "its sampler's score 0.000 ± 0 (n=3) -> 0.000 at tick 100, gain 0 ± 0 (n=3)" in flat.value
    learns = claims(_same_sampler_runs({t: 0.2 + 0.004 * t for t in range(0, 101, 10)}))[10]
    assert learns.status == "PASS" and learns.values["gain"] == pytest.approx(0.36)


def test_the_kl_claims_read_the_last_tick_every_seed_has_a_finite_value_at():
    """Method's seed 2 logs a NaN KL at tick 150, the last tick of every run: claim 4 is read at tick 149,
    where all three seeds of both conditions have a value (paired, n = 3), not at 150 on two method seeds;
    with every dense seed NaN there, the same, where the report once stopped on an empty side."""
    kl = {
        "dense": lambda seed, t: 0.01 + 0.001 * int(seed),
        "method": lambda seed, t: float("nan") if (seed == "2" and t == 150) else 1.0 + 0.1 * int(seed),
    }
    runs = base_runs()
    for r in runs:
        if r.condition in kl:
            r.metrics["actor/kl_loss"] = series({t: kl[r.condition](r.seed, t) for t in range(151)})
    claim = claims(runs)[4]
    read = claim.checks[0].interval
    assert "at tick 149" in claim.value and read.n == 3 and read.paired
    for r in runs:
        if r.condition == "dense":
            r.metrics["actor/kl_loss"] = series({t: float("nan") if t == 150 else 0.01 for t in range(151)})
    assert "at tick 149" in claims(runs)[4].value


def test_the_bytes_tables_ratio_is_the_running_ratio_at_the_read_tick_not_its_mean_over_ticks():
    """``comm/ratio_vs_dense`` is cumulative bytes over cumulative dense bytes so far: tick 0's fire makes
    it 1.0 there, and it falls to the run's ratio (0.4 at the read tick); its mean over ticks (0.58 here)
    overstated the ratio, most for the runs that send least (anchor_off by ~29% in the tiny pair)."""
    ratio = {0: 1.0, 25: 0.6, 50: 0.5, 100: 0.4, 150: 0.38}
    runs = []
    for seed in SEEDS:
        metrics = {
            "comm/ratio_vs_dense": series(ratio),
            "comm/bytes_cumulative": series({0: 10.0, 100: 50.0}),
        }
        runs.append(
            TrainRun(f"method-{seed}", "method", "method", "", seed, "FINISHED", READ_AT, 150, metrics)
        )
    (row,) = bytes_table(pair(runs)).rows
    assert row[2].estimate == pytest.approx(0.4) and row[2].n == 3
