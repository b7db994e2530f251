"""The network cost model against hand computations: the collectives, the layout mapping of the ledger's
channels, the pipelined stage boundaries and their limits, the largest stage's weight update, FSDP's update
(reduce-scatter or all-reduce, then the parameters all-gathered), the two overlap bounds, the crossover, zero
bytes, and pair A's analytic inputs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from commrl.compression.ledger import pair_a_summary, qwen25_15b_shapes
from commrl.netmodel import (
    ChannelBytes,
    Compute,
    Layout,
    Link,
    NetModelError,
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
from commrl.netmodel.cost import activation_time
from commrl.netmodel.inputs import Qwen2Shape, analytic_inputs, stage_layers

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
    28-point ledger, one micro-batch: activations A / (P D) per boundary over the 3 boundaries in turn
    (2 traversals, 3 messages each), basis R / P, weights W / S all-reduced over D unless the largest
    stage's share is given; a single stage sends no activations."""
    link = Link("slow", 0.2, 50.0)
    assert p2p_time(25e6, link, messages=3) == pytest.approx(150e-6 + 1.0, rel=1e-12)
    layout = Layout(stages=4, dp=2, points=28, collective="allreduce")
    t = comm_time(ChannelBytes(28 * 2 * 1e9, 28e6, 4e9, 2), layout, IB100)
    assert t.activations == pytest.approx(6e-6 + 3 * 1e9 / 12.5e9, rel=1e-12)
    assert t.basis == pytest.approx(1e-6 + 1e6 / 12.5e9, rel=1e-12)
    assert t.weights == pytest.approx(2e-6 + 1e9 / 12.5e9, rel=1e-12)  # 2 (2-1)/2 * (4e9 / 4) / beta
    assert t.total == pytest.approx(t.activations + t.basis + t.weights)
    largest = comm_time(ChannelBytes(0, 0, 4e9, 2, stage_weights=1.5e9), layout, IB100)
    assert largest.weights == pytest.approx(2e-6 + 1.5e9 / 12.5e9, rel=1e-12)
    rs_ag = comm_time(ChannelBytes(0, 0, 4e9, 2), Layout(4, 2, 28, "rs_ag", gathers=1), IB100)
    assert rs_ag.weights == pytest.approx(t.weights, rel=1e-12)  # dense, gathered once: an all-reduce's cost
    single = comm_time(ChannelBytes(1e9, 1e6, 4e9, 2), Layout(stages=1, dp=2, points=28), IB100)
    assert single.activations == 0.0 and single.basis == 0.0


def test_pipelined_boundaries_against_the_hand_computation_and_limits():
    """``A / (P D) = 1e9`` bytes over 4 traversals, 4 stages, 8 micro-batches at 12.5e9 bytes/s, 1 us:
    ``(m + S - 2) / m * 0.08 s + n (m + S - 2) alpha = 10/8 * 0.08 + 40 us``. One micro-batch: the 3
    boundaries one after the other, 3 * 0.08 s + 12 us; many: one boundary's 0.08 s; 2 stages, one
    micro-batch: one boundary, one message per traversal; one stage: nothing."""
    a = 28 * 2 * 1e9

    def t(stages: int, micro_batches: int, link: Link = IB100) -> float:
        return float(activation_time(a, 4, Layout(stages, 2, 28, micro_batches=micro_batches), link))

    assert t(4, 8) == pytest.approx(10 / 8 * 0.08 + 40e-6, rel=1e-12)
    assert t(4, 1) == pytest.approx(3 * 0.08 + 12e-6, rel=1e-12)
    no_latency = Link("ib, no latency", 100.0, 0.0)
    assert t(4, 10**6, no_latency) == pytest.approx(0.08, rel=1e-5)
    assert t(2, 1) == pytest.approx(0.08 + 4e-6, rel=1e-12)
    assert t(1, 8) == 0.0
    per_tick = activation_time(np.array([a, 0.0]), np.array([4, 3]), Layout(4, 2, 28, micro_batches=8), IB100)
    assert per_tick.tolist() == pytest.approx([t(4, 8), 0.0])  # no bytes, no message


def test_weight_update_is_set_by_the_largest_stage():
    """Layers as even as possible (the left-over ones to the middle stages, then the first); pair A on 4
    stages: 7 layers of 46,797,824 parameters each, the embedding 151936 x 1536 = 233,373,696 on the first
    stage, the final norm (1536) and the tied head's copy of the embedding on the last: 560,960,000
    parameters, 1.45 x the even share W / 4; PowerSGD's rank-77 factors on a fast tick: 34,070,144. FSDP
    reduce-scatters that stage's fp32 gradients and all-gathers its bf16 parameters (pair_A.yaml)."""
    assert stage_layers(28, 4) == [7, 7, 7, 7] and stage_layers(30, 4) == [7, 8, 8, 7]
    assert stage_layers(31, 4) == [8, 8, 8, 7] and stage_layers(4, 5) == [1, 1, 1, 1, 0]
    assert stage_layers(5, 1) == [5] and stage_layers(3, 2) == [2, 1]
    cfg = load_config(config_dir() / "pair_A.yaml")
    shape = cfg.analytic.model
    params = [sum(int(np.prod(p)) for p in stage) for stage in shape.stage_shapes(4)]
    assert params == [233_373_696 + 7 * 46_797_824, 7 * 46_797_824, 7 * 46_797_824, 560_960_000]
    whole = sorted(shape.weight_shapes())
    assert sorted(shape.stage_shapes(1)[0]) == whole  # one stage: the tied head is the embedding itself
    untied = Qwen2Shape(64, 3, 128, 2, 1, 259, False)
    assert sorted(p for stage in untied.stage_shapes(2) for p in stage) == sorted(untied.weight_shapes())
    shares = cfg.analytic.stage_weight_bytes(4)
    assert shares == {"dense": 4 * 560_960_000, "fire": 4 * 560_960_000, "fast": 4 * 34_070_144}
    assert shares["dense"] / (pair_a_summary().dense_weights / 4) == pytest.approx(1.4535, abs=1e-4)
    inputs = analytic_inputs(cfg.analytic, Compute(None), ticks=3, stages=4)["dense"]
    t = inputs.comm(Layout(4, 8, 28, "rs_ag", gathers=1), IB100).weights
    gradients, parameters = 4 * 560_960_000, 2 * 560_960_000
    assert t[0] == pytest.approx(14e-6 + 7 / 8 * (gradients + parameters) / 12.5e9, rel=1e-12)


def test_rs_ag_reduce_scatters_even_a_compressed_update_and_gathers_the_parameters_dense():
    """FSDP (``rs_ag``) on 4 stages x 2 replicas, 1e9 parameter bytes a stage: a dense update (W = P) is
    reduce-scattered and the parameters all-gathered, 2 (1 us + 1/2 * 1e9 / 12.5e9 s); a compressed one
    (W = 1e8 a stage < P) is reduce-scattered dense all the same (verl's engine compresses the shards FSDP
    reduced), 1 us + 1/2 * 1e9 / 12.5e9 s, its factors ring all-reduced after, 2 us + 1e8 / 12.5e9 s, then
    the parameters all-gathered; DDP (``allreduce``) sends the factors alone (PowerSGD's DDP hook) and no
    parameters; given stage shares set both."""
    fsdp, ddp = Layout(4, 2, 28, "rs_ag", gathers=1), Layout(4, 2, 28, "allreduce")
    dense = comm_time(ChannelBytes(0, 0, 4e9, 2, params=4e9), fsdp, IB100).weights
    assert dense == pytest.approx(2 * (1e-6 + 0.5 * 1e9 / 12.5e9), rel=1e-12)
    compressed = ChannelBytes(0, 0, 4e8, 2, params=4e9)
    gather = reduce = 1e-6 + 0.5 * 1e9 / 12.5e9
    assert comm_time(compressed, fsdp, IB100).weights == pytest.approx(
        reduce + 2e-6 + 1e8 / 12.5e9 + gather, rel=1e-12
    )
    assert comm_time(compressed, ddp, IB100).weights == pytest.approx(2e-6 + 1e8 / 12.5e9, rel=1e-12)
    per_tick = ChannelBytes(0, 0, np.array([4e9, 4e8]), 2, params=np.array([4e9, 4e9]))
    assert comm_time(per_tick, fsdp, IB100).weights.tolist() == pytest.approx(
        [dense, reduce + 2e-6 + 1e8 / 12.5e9 + gather], rel=1e-12
    )
    shares = ChannelBytes(0, 0, 4e8, 2, stage_weights=2e8, params=4e9, stage_params=1.5e9)
    expected = 2 * (1e-6 + 0.5 * 1.5e9 / 12.5e9) + 2e-6 + 2e8 / 12.5e9
    assert comm_time(shares, fsdp, IB100).weights == pytest.approx(expected, rel=1e-12)


def test_rs_ag_gathers_the_parameters_at_their_own_element_size():
    """FSDP with mixed precision (verl's default: fp32 gradients reduced, bf16 parameters gathered,
    ``param_scale = 2 / 4``), 4 stages x 2 replicas, 1e9 gradient bytes a stage: a dense update
    reduce-scatters 1e9 bytes and all-gathers 0.5e9, 2 us + 1/2 x 1.5e9 / 12.5e9 s. Whether an update is
    compressed is judged against the dense update at the gradients' element size, not against the gathered
    bytes: 3e9 of a dense 4e9 (0.75e9 a stage, above the 0.5e9 gathered) is still a compressed update, its
    factors all-reduced after the dense reduce-scatter."""
    fsdp = Layout(4, 2, 28, "rs_ag", gathers=1)
    dense = comm_time(ChannelBytes(0, 0, 4e9, 2, param_scale=0.5), fsdp, IB100).weights
    assert dense == pytest.approx(2e-6 + 0.5 * 1.5e9 / 12.5e9, rel=1e-12)
    weak = comm_time(ChannelBytes(0, 0, 3e9, 2, params=4e9, param_scale=0.5), fsdp, IB100).weights
    reduce = 1e-6 + 0.5 * 1e9 / 12.5e9
    assert weak == pytest.approx(reduce + 2e-6 + 0.75e9 / 12.5e9 + 1e-6 + 0.5 * 0.5e9 / 12.5e9, rel=1e-12)
    ddp = comm_time(ChannelBytes(0, 0, 4e9, 2, param_scale=0.5), Layout(4, 2, 28), IB100).weights
    assert ddp == pytest.approx(2e-6 + 1e9 / 12.5e9, rel=1e-12)  # DDP gathers no parameters
    for scale in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(NetModelError, match=r"bytes.param_scale=.* must be a finite number > 0"):
            ChannelBytes(0, 0, 4e9, 2, param_scale=scale)


def test_pair_a_gathers_bf16_parameters_as_verls_fsdp_engine_does():
    """pair_A.yaml's ``param_bytes: 2`` (verl's FSDP ``param_dtype`` default, bf16) against its
    ``grad_bytes: 4`` (``reduce_dtype`` fp32): on 4 stages x 8 replicas at 1GbE dense's update is the
    reduce-scatter of the last stage's 4 x 560,960,000 gradient bytes and the all-gathers of its
    2 x 560,960,000 parameter bytes, gathered once: 2 x 7 x 50 us + 7/8 x 6 x 560,960,000 / 1.25e8 s =
    23.56 s (31.41 s when the parameters were charged at the gradients' 4 bytes); the method's fast tick
    gathers the same bf16 parameters, after the same reduce-scatter. As verl runs it, gathering once per
    traversal and micro-batch (4 x 86) and reduce-scattering once per micro-batch (86), dense's tick sends
    343 more gathers and 85 more reduce-scatters."""
    cfg = load_config(config_dir() / "pair_A.yaml")
    assert (cfg.analytic.param_bytes, cfg.analytic.grad_bytes, cfg.param_scale) == (2, 4, 0.5)
    inputs = analytic_inputs(cfg.analytic, Compute(None), ticks=2, stages=4)
    assert inputs["dense"].param_scale == inputs["method"].param_scale == 0.5
    gbe = Link("1GbE", 1.0, 50.0)
    once = replace(cfg.layout, gathers=1, reduces=1)
    dense = inputs["dense"].comm(once, gbe).weights
    assert dense[0] == pytest.approx(14 * 50e-6 + 7 / 8 * 6 * 560_960_000 / 1.25e8, rel=1e-12)
    assert dense[0] == pytest.approx(23.561, abs=1e-3)
    fast = inputs["method"].comm(once, gbe).weights[1]
    gather = 7 * 50e-6 + 7 / 8 * 2 * 560_960_000 / 1.25e8
    reduce = 7 * 50e-6 + 7 / 8 * 4 * 560_960_000 / 1.25e8
    assert fast == pytest.approx(reduce + 14 * 50e-6 + 7 / 4 * 4 * 34_070_144 / 1.25e8 + gather, rel=1e-12)
    assert cfg.layout.gathers is None and cfg.layout.reduces is None and cfg.layout.micro_batches == 86
    assert inputs["dense"].comm(cfg.layout, gbe).weights[0] == pytest.approx(
        dense[0] + 343 * gather + 85 * reduce, rel=1e-12
    )


def test_pair_a_method_under_rs_ag_gathers_the_dense_parameters():
    """Pair A on 4 stages x 8 replicas, FSDP reducing and gathering once a tick: a fast tick reduce-scatters
    the last stage's fp32 gradients, 4 x 560,960,000 bytes, as dense does (verl's engine compresses the
    reduced shards), ring-all-reduces its PowerSGD factors, 4 x 34,070,144 bytes, 2 x 7 latencies + 7/4 of
    the bytes, and all-gathers its parameters in bf16 (verl's FSDP param_dtype), 2 x 560,960,000 bytes,
    7 latencies + 7/8 of the bytes; a fire tick updates dense, as dense does. Under DDP the factors travel
    instead of the gradients (PowerSGD's hook)."""
    cfg = load_config(config_dir() / "pair_A.yaml")
    assert cfg.layout.collective == "rs_ag"
    inputs = analytic_inputs(cfg.analytic, Compute(None), ticks=21, stages=4)
    method, dense = inputs["method"], inputs["dense"]
    once = replace(cfg.layout, gathers=1, reduces=1)
    t = method.comm(once, IB100).weights
    factors, gradients, params = 4 * 34_070_144, 4 * 560_960_000, 2 * 560_960_000
    assert cfg.analytic.param_bytes == 2 and cfg.analytic.grad_bytes == 4
    dense_update = 14e-6 + 7 / 8 * (gradients + params) / 12.5e9
    assert t[1] == pytest.approx(dense_update + 14e-6 + 7 / 4 * factors / 12.5e9, rel=1e-12)
    assert t[0] == pytest.approx(dense_update, rel=1e-12) and t[20] == t[0]
    assert np.all(dense.comm(once, IB100).weights == t[0])
    ddp = replace(cfg.layout, collective="allreduce")
    assert method.comm(ddp, IB100).weights[1] == pytest.approx(14e-6 + 7 / 4 * factors / 12.5e9, rel=1e-12)


def test_a_fire_tick_of_the_engine_updates_every_mini_batch_dense():
    """With two mini-batches a tick verl's engine logs two dense updates on a fire tick (the replay of the
    first, the second updated dense), as dense does every tick; the local driver's ledger formula
    (``analytic_tick_bytes``' default) one, its replay of the whole batch."""
    spec = replace(load_config(config_dir() / "pair_A.yaml").analytic, updates_per_tick=2)
    inputs = analytic_inputs(spec, Compute(None), ticks=2, stages=4)
    one_update = pair_a_summary().dense_weights
    assert inputs["method"].weights[0] == inputs["dense"].weights[0] == 2 * one_update
    assert inputs["method"].weights[1] == 2 * pair_a_summary().fast_weights
    assert spec.stage_weight_bytes(4)["fire"] == 2 * 4 * 560_960_000
    assert inputs["method"].stage_weights[0] == inputs["dense"].stage_weights[0]
    assert pair_a_summary(updates_per_tick=2).fire_weights == one_update


def test_overlap_bounds():
    assert tick_time(2.0, 1.0, 3.0, overlap=False) == 6.0  # sample + train + comm
    assert tick_time(2.0, 1.0, 3.0, overlap=True) == 4.0  # sample + max(train, comm)
    assert tick_time(2.0, 1.0, 0.5, overlap=True) == 3.0


def test_a_run_with_zero_bytes_costs_only_compute():
    """No bytes: no message goes out, not even a latency; at any link both bounds are compute alone."""
    steps = np.arange(1, 6)
    zeros = np.zeros(5)
    train, sample = np.array([0.5, 0.6, 0.7, 0.5, 0.4]), np.full(5, 0.2)
    inputs = TickInputs(steps, zeros, zeros, zeros, train, sample, np.full(5, 4))
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


def test_pair_a_inputs_count_every_pass_of_the_engine_with_the_anchor_schedule():
    """pair_A.yaml's architecture constants give the ledger's Qwen2.5-1.5B shapes; weights and the basis are
    ``pair_a_summary()``'s; activations are the engine's 4 traversals (the ledger's formula has the 2
    training ones): dense 4 d, a fast tick 4 r, a fire the old and reference forwards at r and the dense
    replay's 2 d; the method fires at ticks t = 0, 20, 40 (steps 1, 21, 41)."""
    cfg = load_config(config_dir() / "pair_A.yaml")
    assert cfg.analytic.model.weight_shapes() == [tuple(s) for s in qwen25_15b_shapes()["weight_shapes"]]
    assert cfg.layout.points == 28 and cfg.compute.train_s is None  # no sourced GPU time: no default
    assert cfg.layout.micro_batches == 86  # ceil(16777216 / 8 / 24576), configs/verl/pair/A.yaml
    assert "no sourced GPU time" in cfg.compute_note
    ledger = pair_a_summary()
    inputs = analytic_inputs(cfg.analytic, Compute(400.0), ticks=60, stages=4)
    dense, method = inputs["dense"], inputs["method"]
    per_pass_r = 28 * 16_777_216 * 77 * 2  # one traversal at rank 77, bf16
    assert np.all(dense.activations == 2 * ledger.dense_activations) and np.all(
        dense.weights == ledger.dense_weights
    )
    fires = method.steps[method.basis > 0]
    assert fires.tolist() == [1, 21, 41]
    assert np.all(method.activations[fires - 1] == ledger.fire_activations + 2 * per_pass_r)
    assert np.all(method.weights[fires - 1] == ledger.fire_weights)
    assert method.activations[1] == 2 * ledger.fast_activations == 4 * per_pass_r
    assert method.weights[1] == ledger.fast_weights
    assert np.all(dense.passes == 4) and np.all(method.passes == 4)
    assert np.all(dense.train_s == 400.0) and np.all(method.train_s == 400.0) and np.all(dense.sample_s == 0)


def test_a_runs_traversals_follow_its_fire_ticks():
    """``bytes: runs``: a tick with ``anchor/fire`` set carries ``passes["fire"]`` traversals, others
    ``passes["fast"]``; activations are the ledger's less the basis refresh."""
    from commrl.netmodel.inputs import run_inputs
    from commrl.report.runs import Series, TrainRun

    def per_step(*values: float) -> Series:
        return Series.from_points(list(enumerate(values)))

    metrics = {
        "comm/bytes_activations": per_step(0, 10, 5, 10),
        "comm/bytes_basis_refresh": per_step(0, 2, 0, 2),
        "comm/bytes_weights": per_step(0, 4, 1, 4),
        "time/train_s": per_step(0, 1, 1, 1),
        "time/sample_s": per_step(0, 1, 1, 1),
        "anchor/fire": per_step(1, 1, 0, 1),
    }
    run = TrainRun("id", "method/seed_0", "method", "lowrank", "0", "FINISHED", 3, 3, metrics)
    inputs, note = run_inputs(None, run, {"fast": 3, "fire": 4})
    assert note is None and inputs is not None
    assert inputs.steps.tolist() == [1, 2, 3] and inputs.passes.tolist() == [4, 3, 4]
    assert inputs.activations.tolist() == [8, 5, 8] and inputs.basis.tolist() == [2, 0, 2]
    assert inputs.params is None  # no dense run's parameters: the updates are dense
    gathered, _ = run_inputs(None, run, {"fast": 3, "fire": 4}, params=10.0)
    assert gathered is not None and gathered.params.tolist() == [4, 10, 4]  # a fire's own dense update


def test_fsdp_gathers_the_parameters_once_per_traversal_and_micro_batch_unless_told():
    """``rs_ag`` with ``gathers`` unset: FSDP's ``reshard_after_forward`` (verl's default) gathers the
    parameters for every micro-batch of every traversal, ``n m`` all-gathers a tick (3 traversals x 5
    micro-batches here, and per tick where the traversals differ); ``gathers`` sets the count; the update's
    reduction and DDP do not change; a bad count names the key."""
    once, per_mb = Layout(4, 2, 28, "rs_ag", 5, gathers=1), Layout(4, 2, 28, "rs_ag", 5)
    gather = 1e-6 + 0.5 * 1e9 / 12.5e9
    t1 = comm_time(ChannelBytes(0, 0, 4e9, 3, params=4e9), once, IB100).weights
    t15 = comm_time(ChannelBytes(0, 0, 4e9, 3, params=4e9), per_mb, IB100).weights
    assert t15 == pytest.approx(t1 + 14 * gather, rel=1e-12)
    ticks = comm_time(ChannelBytes(0, 0, np.array([4e9, 4e9]), np.array([3, 4]), params=4e9), per_mb, IB100)
    assert ticks.weights.tolist() == pytest.approx([t1 + 14 * gather, t1 + 19 * gather], rel=1e-12)
    seven = comm_time(ChannelBytes(0, 0, 4e9, 3, params=4e9), replace(once, gathers=7), IB100).weights
    assert seven == pytest.approx(t1 + 6 * gather, rel=1e-12)
    ddp = replace(per_mb, collective="allreduce")
    assert comm_time(ChannelBytes(0, 0, 4e9, 3), ddp, IB100).weights == pytest.approx(2e-6 + 1e9 / 12.5e9)
    assert (
        "once per traversal and micro-batch" in per_mb.describe()
        and "7x a tick" in replace(once, gathers=7).describe()
    )
    with pytest.raises(NetModelError, match=r"layout.gathers=0 is invalid: must be an integer >= 1 or null"):
        replace(once, gathers=0)


def test_fsdp_reduce_scatters_the_gradients_once_per_micro_batch_unless_told():
    """verl's FSDP engine runs with ``use_no_sync_for_gradient_accumulation: false`` (its generated config)
    and reduce-scatters after every micro-batch's backward: ``reduces`` unset is ``m`` reduce-scatters a
    tick of the dense gradients (5 here), for the method's compressed update as for dense; 1 is
    accumulation (no_sync); DDP does not change; a bad count names the key."""
    per_mb = Layout(4, 2, 28, "rs_ag", 5, gathers=1)
    once = replace(per_mb, reduces=1)
    reduce = 1e-6 + 0.5 * 1e9 / 12.5e9
    for update in (4e9, 4e8):  # dense, and a compressed update's factors
        t1 = comm_time(ChannelBytes(0, 0, update, 3, params=4e9), once, IB100).weights
        t5 = comm_time(ChannelBytes(0, 0, update, 3, params=4e9), per_mb, IB100).weights
        assert t5 == pytest.approx(t1 + 4 * reduce, rel=1e-12)
    ddp = replace(per_mb, collective="allreduce")
    assert comm_time(ChannelBytes(0, 0, 4e9, 3), ddp, IB100).weights == pytest.approx(2e-6 + 1e9 / 12.5e9)
    assert "once per micro-batch" in per_mb.describe() and "3x a tick" in replace(once, reduces=3).describe()
    with pytest.raises(NetModelError, match=r"layout.reduces=0 is invalid: must be an integer >= 1 or null"):
        replace(once, reduces=0)
