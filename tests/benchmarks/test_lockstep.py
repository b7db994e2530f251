"""benchmarks/lockstep.py: the tick ratios the README's benchmark rows quote, with their intervals."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lockstep.py"
spec = importlib.util.spec_from_file_location("lockstep", SCRIPT)
lockstep = importlib.util.module_from_spec(spec)
sys.modules["lockstep"] = lockstep  # its dataclasses look their module up there
spec.loader.exec_module(lockstep)


def arm(walls: list[float], fires: list[bool] | None = None, warmup: int = 1) -> dict:
    fires = fires or [False] * len(walls)
    return {
        "ticks": [
            {"wall_s": w, "fire": f, "warmup": k < warmup}
            for k, (w, f) in enumerate(zip(walls, fires, strict=True))
        ]
    }


def test_ratio_of_paired_ticks_has_both_intervals_around_its_estimates():
    rng = np.random.default_rng(0)
    dense = 1.0 + rng.exponential(0.1, size=21)  # a busy machine only adds time
    method = 1.2 * dense * (1.0 + rng.normal(0.0, 0.02, size=21))
    r = lockstep.ratio(arm(list(method)), arm(list(dense)))
    assert r["n"] == 20  # the warm-up tick is not counted
    assert r["of_means_low"] < r["of_means"] < r["of_means_high"]
    assert r["median_low"] <= r["median_paired"] <= r["median_high"]
    assert r["of_means_low"] < 1.2 < r["of_means_high"] and r["median_low"] < 1.2 < r["median_high"]
    ratios = np.sort(method[1:] / dense[1:])  # 20 paired ratios: the 6th and 15th are the median's bounds
    assert (r["median_low"], r["median_high"]) == pytest.approx((ratios[5], ratios[14]))


def test_ratio_of_few_fire_ticks_has_no_median_interval_and_none_without_ticks():
    fires = [k % 2 == 1 for k in range(9)]
    r = lockstep.ratio(arm([1.0, 2.0] * 4 + [1.0], fires), arm([1.0] * 9), fire=True)
    assert r["n"] == 4 and r["median_paired"] == 2.0
    assert r["median_low"] is None and r["median_high"] is None  # a median's 95% interval needs 6
    assert lockstep.interval_text(r["median_low"], r["median_high"]) == "-"
    none = lockstep.ratio(arm([1.0, 1.0], warmup=2), arm([1.0, 1.0], warmup=2))
    assert none["n"] == 0 and none["median_low"] is None and np.isnan(none["of_means"])
