import pytest

from commrl.rl.config import HealthConfig
from commrl.rl.health import CollapseMonitor, NonFiniteLossError, check_finite, least_squares_slope


def test_slope_of_a_line():
    assert least_squares_slope([1.0, 3.0, 5.0, 7.0]) == pytest.approx(2.0)


def test_flat_run_raises_no_alarm_and_climbing_kl_does():
    mon = CollapseMonitor(HealthConfig(window=4, kl_slope=0.5))
    for _ in range(8):
        assert (
            mon.update({"actor/kl_loss": 0.01, "actor/pg_clipfrac": 0.0, "mismatch/logprob_corr": 0.99}) == []
        )
    reasons = []
    for i in range(4):
        reasons = mon.update(
            {"actor/kl_loss": 1.0 * i, "actor/pg_clipfrac": 0.0, "mismatch/logprob_corr": 0.99}
        )
    assert reasons and "KL slope" in reasons[0]


def test_correlation_drop_alarms_and_state_round_trips():
    mon = CollapseMonitor(HealthConfig(window=3, corr_drop=0.3))
    for _ in range(3):
        mon.update({"mismatch/logprob_corr": 0.95})
    other = CollapseMonitor(HealthConfig(window=3, corr_drop=0.3))
    other.load_state_dict(mon.state_dict())
    for _ in range(3):
        reasons = other.update({"mismatch/logprob_corr": 0.4})
    assert any("correlation" in r for r in reasons)


def test_non_finite_loss_names_the_tick():
    with pytest.raises(NonFiniteLossError, match="tick 7"):
        check_finite(float("nan"), 7)


def test_fire_ticks_clip_fraction_is_left_out():
    """A method run's clip fraction rises linearly on its fast ticks; its fires (even ticks) log 0, the
    ratio-one replay. Fed in, the zeros read as acceleration and raise a false alarm; they are left out."""
    cfg = HealthConfig()
    fired, fast_only = CollapseMonitor(cfg), CollapseMonitor(cfg)
    alarms = []
    for t in range(40):
        fire = float(t % 2 == 0)
        metrics = {"actor/pg_clipfrac": 0.0 if fire else 0.015 * t, "anchor/fire": fire}
        alarms += fired.update(metrics)
        if not fire:
            fast_only.update(metrics)
    assert not alarms
    assert list(fired.clip) == list(fast_only.clip)
    rising = CollapseMonitor(cfg)  # a real acceleration alarms on fast ticks only, not again on a fire
    verdicts = [rising.update({"actor/pg_clipfrac": 0.01 * t * t, "anchor/fire": 0.0}) for t in range(10)]
    assert verdicts[-1] and not rising.update({"actor/pg_clipfrac": 0.0, "anchor/fire": 1.0})
