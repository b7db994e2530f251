"""The network cost model against hand computations: the collectives, the layout mapping of the ledger's
channels, the two overlap bounds, the crossover, zero bytes, and pair A's analytic inputs."""

from __future__ import annotations

import numpy as np
import pytest

from commrl.compression.ledger import pair_a_summary, qwen25_15b_shapes
from commrl.netmodel import (
    ChannelBytes,
    Compute,
    Layout,
    Link,
    TickInputs,
    all_gather_time,
    comm_time,
    crossover_bandwidth,
    load_config,
    p2p_time,
    reduce_scatter_time,
    ring_allreduce_time,
    tick_time,
)
from commrl.netmodel.config import config_dir
from commrl.netmodel.inputs import analytic_inputs

IB100 = Link("ib", 100.0, 1.0)  # 100 Gbit/s = 12.5e9 bytes/s, 1 us per message


def test_ring_allreduce_matches_the_hand_computation():
    """1 GB over 8 ranks at 100 Gbit/s, 1 us: 2 (n-1) alpha + 2 (n-1)/n bytes / beta
    = 14 us + 1.75 * 1e9 / 12.5e9 s = 0.140014 s."""
    assert ring_allreduce_time(1e9, 8, IB100) == pytest.approx(14e-6 + 0.14, rel=1e-12)
    # reduce-scatter and all-gather: (n-1) alpha + (n-1)/n bytes / beta each; together the all-reduce
    assert reduce_scatter_time(1e9, 8, IB100) == pytest.approx(7e-6 + 0.07, rel=1e-12)
    assert all_gather_time(1e9, 8, IB100) == pytest.approx(7e-6 + 0.07, rel=1e-12)
    assert ring_allreduce_time(1e9, 1, IB100) == 0.0  # one rank: nothing to reduce


def test_point_to_point_and_the_layout_mapping():
    """25 MB in 3 messages at 200 Mbit/s, 50 us: 150 us + 1 s. A tick on 4 stages x 2 replicas of a
    28-point ledger: activations A / (P D) per boundary (2 messages), basis R / P, weights W / S all-reduced
    over D; a single stage sends no activations."""
    link = Link("slow", 0.2, 50.0)
    assert p2p_time(25e6, link, messages=3) == pytest.approx(150e-6 + 1.0, rel=1e-12)
    layout = Layout(stages=4, dp=2, points=28, collective="allreduce")
    t = comm_time(ChannelBytes(activations=28 * 2 * 1e9, basis=28e6, weights=4e9), layout, IB100)
    assert t.activations == pytest.approx(2e-6 + 1e9 / 12.5e9, rel=1e-12)
    assert t.basis == pytest.approx(1e-6 + 1e6 / 12.5e9, rel=1e-12)
    assert t.weights == pytest.approx(2e-6 + 1e9 / 12.5e9, rel=1e-12)  # 2 (2-1)/2 * (4e9 / 4) / beta
    assert t.total == pytest.approx(t.activations + t.basis + t.weights)
    rs_ag = comm_time(ChannelBytes(0, 0, 4e9), Layout(4, 2, 28, "rs_ag"), IB100)
    assert rs_ag.weights == pytest.approx(t.weights, rel=1e-12)  # the same cost as the ring all-reduce
    single = comm_time(ChannelBytes(1e9, 1e6, 4e9), Layout(stages=1, dp=2, points=28), IB100)
    assert single.activations == 0.0 and single.basis == 0.0


def test_overlap_bounds():
    assert tick_time(2.0, 1.0, 3.0, overlap=False) == 6.0  # sample + train + comm
    assert tick_time(2.0, 1.0, 3.0, overlap=True) == 4.0  # sample + max(train, comm)
    assert tick_time(2.0, 1.0, 0.5, overlap=True) == 3.0


def test_a_run_with_zero_bytes_costs_only_compute():
    """No bytes: no message goes out, not even a latency; at any link both bounds are compute alone."""
    steps = np.arange(1, 6)
    zeros = np.zeros(5)
    train, sample = np.array([0.5, 0.6, 0.7, 0.5, 0.4]), np.full(5, 0.2)
    inputs = TickInputs(steps, zeros, zeros, zeros, train, sample)
    for link in (Link("slow", 0.001, 1e4), IB100):
        for layout in (Layout(5, 2, 4), Layout(1, 8, 4, "rs_ag")):
            assert np.all(inputs.comm(layout, link).total == 0.0)
            for overlap in (False, True):
                assert np.array_equal(inputs.tick_times(layout, link, overlap), train + sample)


def test_crossover_against_the_closed_form():
    """Dense ``1 + 10/B``, method ``1.1 + 1/B`` (no overlap): the method pays while
    ``1.1 + 1/B < 1 + 10/B``, i.e. below ``B* = 9 / 0.1 = 90`` Gbit/s; with a 1% tolerance,
    ``1.1 + 1/B < 0.99 (1 + 10/B)`` gives ``B* = 8.9 / 0.11``."""
    exact = crossover_bandwidth(lambda b: 1 + 10 / b, lambda b: 1.1 + 1 / b, 0.1, 400, tolerance=0.0)
    assert exact.status == "crossover" and exact.gbps == pytest.approx(90.0, rel=1e-5)
    tol = crossover_bandwidth(lambda b: 1 + 10 / b, lambda b: 1.1 + 1 / b, 0.1, 400, tolerance=0.01)
    assert tol.gbps == pytest.approx(8.9 / 0.11, rel=1e-5)
    assert "80.9 Gbit/s" in tol.describe()
    always = crossover_bandwidth(lambda b: 1 + 10 / b, lambda b: 0.5 + 1 / b, 0.1, 400)
    never = crossover_bandwidth(lambda b: 1 + 10 / b, lambda b: 2 + 10 / b, 0.1, 400)
    assert (always.status, always.gbps, never.status) == ("always_pays", None, "never_pays")


def test_pair_a_inputs_come_from_the_ledger_with_the_anchor_schedule():
    """pair_A.yaml's architecture constants give the ledger's Qwen2.5-1.5B shapes; its tick bytes are
    ``pair_a_summary()``'s; the method fires at ticks t = 0, 20, 40 (steps 1, 21, 41)."""
    cfg = load_config(config_dir() / "pair_A.yaml")
    assert cfg.analytic.model.weight_shapes() == [tuple(s) for s in qwen25_15b_shapes()["weight_shapes"]]
    assert cfg.layout.points == 28 and cfg.compute.train_s is None  # no sourced GPU time: no default
    assert "no sourced GPU time" in cfg.compute_note
    ledger = pair_a_summary()
    inputs = analytic_inputs(cfg.analytic, Compute(400.0), ticks=60)
    dense, method = inputs["dense"], inputs["method"]
    assert np.all(dense.activations == ledger.dense_activations) and np.all(
        dense.weights == ledger.dense_weights
    )
    fires = method.steps[method.basis > 0]
    assert fires.tolist() == [1, 21, 41]
    assert np.all(method.activations[fires - 1] == ledger.fire_activations)
    assert np.all(method.weights[fires - 1] == ledger.fire_weights)
    assert method.activations[1] == ledger.fast_activations and method.weights[1] == ledger.fast_weights
    assert np.all(dense.train_s == 400.0) and np.all(method.train_s == 400.0) and np.all(dense.sample_s == 0)
