"""The two-circuit controller on a tiny Qwen2: schedule, the fire's exact dense update, fast-tick
correction, calibration, bit-identical resume, and the ledger against the analytic formula."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from compression_helpers import HIDDEN, batch_for_tick, lm_loss, tiny_qwen2

from commrl.compression import (
    MethodConfig,
    PowerSGD,
    TwoCircuitController,
    analytic_tick_bytes,
    orth,
    secant_projection,
    sign_correct,
)

MICROBATCHES = 2
LR = 0.05


def make(cfg: MethodConfig, seed: int = 0):
    model = tiny_qwen2(seed)
    ctrl = TwoCircuitController(model, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    return model, ctrl, opt


def tick_batch(tick: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [batch_for_tick(tick, j) for j in range(MICROBATCHES)]


def dense_replay_fn(model, opt, tick):
    def replay():
        opt.zero_grad()
        for ids, mask in tick_batch(tick):
            (lm_loss(model, ids, mask) / MICROBATCHES).backward()

    return replay


def run_ticks(model, ctrl, opt, ticks: int) -> list[dict]:
    """The driver loop of docs/design.md: fire + optimizer step, or one step per compressed minibatch."""
    log = []
    for _ in range(ticks):
        t = ctrl.tick
        metrics = {}
        if ctrl.is_fire_tick():
            metrics = ctrl.fire(dense_replay_fn(model, opt, t))
            opt.step()
        else:
            if ctrl.is_calibration_tick():
                ids, mask = tick_batch(t)[0]
                ctrl.calibrate(lambda ids=ids, mask=mask: model(input_ids=ids, attention_mask=mask.long()))
            for j, (ids, mask) in enumerate(tick_batch(t)):
                opt.zero_grad()
                with ctrl.compressed(microbatch_id=j, token_mask=mask):
                    lm_loss(model, ids, mask).backward()
                ctrl.compress_gradients()
                opt.step()
        log.append(metrics | ctrl.end_tick())
    return log


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_fires_at_multiples_of_the_cadence():
    model, ctrl, opt = make(MethodConfig(rank=8, cadence=3))
    log = run_ticks(model, ctrl, opt, 8)
    assert [m["anchor/fire"] for m in log] == [1, 0, 0, 1, 0, 0, 1, 0]
    assert ctrl.tick == 8
    assert [m["anchor/visible_snapshots"] for m in log if "anchor/visible_snapshots" in m] == [0, 1, 2]
    assert len(ctrl.snapshots) == 3  # two for the secant + the newest, not yet visible


def test_fire_applies_exactly_the_dense_update_at_the_projection():
    """At t = 2K: theta_proj = secant of the snapshots at 0 and K; p.grad = grad of the loss there;
    Q = orth(sum A^T A Q_old); M = beta M + (1 - beta) G; live weights back; then the step is dense."""
    K = 2
    cfg = MethodConfig(rank=8, cadence=K)
    model, ctrl, opt = make(cfg)
    snaps = {}
    for t in range(2 * K):
        if t % K == 0:
            snaps[t] = weights(model)
        run_ticks(model, ctrl, opt, 1)
    live = weights(model)
    memory_before = {n: ctrl.memory[n].clone() for n in live}
    bases_before = [Q.clone() for Q in ctrl.codec.bases]

    manual = tiny_qwen2()
    with torch.no_grad():
        for n, p in manual.named_parameters():
            p.copy_(secant_projection(snaps[K][n], snaps[0][n], K, 0, 2 * K, 1.0))
    seen = []
    for layer in manual.model.layers:
        layer.register_forward_hook(lambda m, a, out: seen.append(out.detach()))
    masks = []
    for ids, mask in tick_batch(2 * K):
        (lm_loss(manual, ids, mask) / MICROBATCHES).backward()
        masks.append(mask)
    expected_grads = {n: p.grad for n, p in manual.named_parameters()}
    expected_bases = []
    for point in range(len(bases_before)):
        S = torch.zeros(HIDDEN, 8)
        for A, mask in zip(seen[point::2], masks, strict=True):
            S += A[mask].T @ (A[mask] @ bases_before[point])
        expected_bases.append(orth(S))

    metrics = ctrl.fire(dense_replay_fn(model, opt, 2 * K))
    assert metrics["anchor/visible_snapshots"] == 2 and metrics["anchor/projection_distance"] > 0
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), live[n]), f"{n}: live weights not restored"
        torch.testing.assert_close(p.grad, expected_grads[n], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(
            ctrl.memory[n], 0.25 * memory_before[n] + 0.75 * p.grad, atol=1e-7, rtol=1e-6
        )
    for Q, Q_expected in zip(ctrl.codec.bases, expected_bases, strict=True):
        torch.testing.assert_close(Q, Q_expected, atol=1e-4, rtol=1e-4)
    sgd_state = copy.deepcopy(opt.state_dict())
    opt.step()
    for n, p in model.named_parameters():
        buf = sgd_state["state"][list(live).index(n)]["momentum_buffer"]
        torch.testing.assert_close(
            p.detach(), live[n] - LR * (0.9 * buf + expected_grads[n]), atol=1e-6, rtol=1e-5
        )
    with pytest.raises(RuntimeError, match="fire tick"):
        ctrl.compress_gradients()
    assert ctrl.end_tick()["anchor/fire"] == 1.0
    with pytest.raises(RuntimeError, match="fires at multiples"):
        ctrl.fire(lambda: None)


def test_fast_tick_is_powersgd_then_sign_correction():
    cfg = MethodConfig(rank=8, cadence=5)
    model, ctrl, opt = make(cfg)
    run_ticks(model, ctrl, opt, 1)  # the fire at t = 0 sets M = G_dense
    ids, mask = tick_batch(1)[0]
    opt.zero_grad()
    with ctrl.compressed(0, mask):
        lm_loss(model, ids, mask).backward()
    raw = {n: p.grad.clone() for n, p in model.named_parameters()}
    ctrl.compress_gradients()
    expected = dict(raw)
    PowerSGD(rank=8, min_compression_rate=2.0, seed=cfg.seed).compress_(expected)
    for n, p in model.named_parameters():
        torch.testing.assert_close(
            p.grad, sign_correct(expected[n], ctrl.memory[n], 0.25), atol=1e-6, rtol=1e-5
        )
    assert not torch.equal(
        model.model.layers[0].mlp.up_proj.weight.grad, raw["model.layers.0.mlp.up_proj.weight"]
    )


def test_anchor_off_calibrates_once_and_never_fires():
    model, ctrl, opt = make(MethodConfig(rank=8, anchor=False))
    initial = [Q.clone() for Q in ctrl.codec.bases]
    assert ctrl.is_calibration_tick() and not ctrl.is_fire_tick()
    before = weights(model)
    ids, mask = tick_batch(0)[0]
    metrics = ctrl.calibrate(lambda: model(input_ids=ids, attention_mask=mask.long()))
    assert 0 < metrics["anchor/basis_overlap"] < 1
    assert all(not torch.equal(a, b) for a, b in zip(initial, ctrl.codec.bases, strict=True))
    assert not ctrl.memory and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    calibrated = [Q.clone() for Q in ctrl.codec.bases]
    ctrl.end_tick()
    log = run_ticks(model, ctrl, opt, 3)
    assert [m["anchor/fire"] for m in log] == [0, 0, 0] and not ctrl.memory
    assert all(torch.equal(a, b) for a, b in zip(calibrated, ctrl.codec.bases, strict=True))
    with pytest.raises(RuntimeError, match="only at t = 0"):
        ctrl.calibrate(lambda: None)


@pytest.mark.parametrize(
    "cfg",
    [
        MethodConfig(rank=8, cadence=2, projection="secant"),
        MethodConfig(codec="prf_mask", rank=8, cadence=2, projection="relex", relex_window=3),
        MethodConfig(rank=8, cadence=3, projection="progressive", progressive_fires=2, delay=1),
    ],
    ids=["lowrank-secant", "prf-relex", "progressive"],
)
def test_resume_is_bit_identical(cfg):
    """8 ticks straight == 4 ticks, torch.save of (model, optimizer, controller), fresh objects, 4 ticks."""
    model, ctrl, opt = make(cfg)
    run_ticks(model, ctrl, opt, 8)

    first, first_ctrl, first_opt = make(cfg)
    run_ticks(first, first_ctrl, first_opt, 4)
    buffer = io.BytesIO()
    torch.save(
        {"model": first.state_dict(), "opt": first_opt.state_dict(), "ctrl": first_ctrl.state_dict()}, buffer
    )
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed, resumed_ctrl, resumed_opt = make(
        cfg, seed=1
    )  # different init: everything must come from the save
    resumed.load_state_dict(saved["model"])
    resumed_opt.load_state_dict(saved["opt"])
    resumed_ctrl.load_state_dict(saved["ctrl"])
    assert resumed_ctrl.tick == 4
    run_ticks(resumed, resumed_ctrl, resumed_opt, 4)
    for (n, p), (_, q) in zip(model.named_parameters(), resumed.named_parameters(), strict=True):
        assert torch.equal(p, q), f"{n} differs after resume"
    assert resumed_ctrl.ledger.cumulative == ctrl.ledger.cumulative


def test_resume_with_other_settings_is_refused():
    _, ctrl, _ = make(MethodConfig(rank=8, cadence=2))
    _, other, _ = make(MethodConfig(rank=8, cadence=3))
    with pytest.raises(ValueError, match="cadence"):
        other.load_state_dict(ctrl.state_dict())


@pytest.mark.parametrize("codec", ["lowrank", "prf_mask", "identity"])
def test_ledger_equals_the_analytic_formula(codec):
    K = 3
    cfg = MethodConfig(codec=codec, rank=8, cadence=K)
    model, ctrl, opt = make(cfg)
    log = run_ticks(model, ctrl, opt, 2 * K)
    tokens = sum(int(mask.sum()) for _, mask in tick_batch(0))
    expected = analytic_tick_bytes(
        hidden=HIDDEN,
        layers=2,
        weight_shapes=[p.shape for p in model.parameters()],
        tokens_per_tick=tokens,
        rank=8,
        grad_rank=8,
        cadence=K,
        act_bytes=4,
        grad_bytes=4,
        updates_per_tick=MICROBATCHES,
        codec=codec,
    )
    assert log[0]["comm/bytes_total"] == pytest.approx(expected.fire_tick, rel=1e-12)
    assert log[1]["comm/bytes_total"] == pytest.approx(expected.fast_tick, rel=1e-12)
    assert log[1]["comm/bytes_weights"] == pytest.approx(expected.fast_weights, rel=1e-12)
    assert log[0]["comm/bytes_anchor"] == log[0]["comm/bytes_total"]
    assert log[-1]["comm/bytes_cumulative"] == pytest.approx(
        2 * (expected.fire_tick + (K - 1) * expected.fast_tick)
    )
    assert log[-1]["comm/ratio_vs_dense"] == pytest.approx(expected.ratio_vs_dense, rel=1e-12)
    assert expected.ratio_vs_dense < 1.0


def test_dense_condition_ratio_is_one():
    cfg = MethodConfig(codec="identity", grad_codec="none", anchor=False, rank=8)
    model, ctrl, opt = make(cfg)
    log = run_ticks(model, ctrl, opt, 2)
    assert log[-1]["comm/ratio_vs_dense"] == 1.0 and log[-1]["comm/bytes_total"] > 0


def test_a_failing_replay_leaves_the_live_weights():
    cfg = MethodConfig(rank=8, cadence=2, delay=2)
    model, ctrl, opt = make(cfg)
    run_ticks(model, ctrl, opt, 4)  # at t = 4 the secant moves the weights before the replay
    live = weights(model)

    def broken_replay():
        raise RuntimeError("out of memory in the replay")

    with pytest.raises(RuntimeError, match="out of memory"):
        ctrl.fire(broken_replay)
    assert all(torch.equal(p, live[n]) for n, p in model.named_parameters())
