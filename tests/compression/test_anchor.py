"""The two-circuit controller on a tiny Qwen2: schedule, the fire's exact dense update, fast-tick
correction, calibration, bit-identical resume, the ledger against the analytic formula, the fast circuit's
read-outs (gradient cosines, energy captured, sign agreement) against hand computations, and the readings
``points``, ``sign_scope``, ``prf_keep`` and ``fast_step``."""

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
    compression_layers,
    orth,
    secant_projection,
    sign_correct,
)
from commrl.errors import ConfigError

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


def codec_replay_fn(model, ctrl, opt, tick):
    """The same replay through the codec, micro-batch j with PRF key j (the fire's ``codec_replay``)."""

    def replay():
        opt.zero_grad()
        for j, (ids, mask) in enumerate(tick_batch(tick)):
            with ctrl.compressed(microbatch_id=j, token_mask=mask):
                (lm_loss(model, ids, mask) / MICROBATCHES).backward()

    return replay


def run_ticks(model, ctrl, opt, ticks: int, codec_replay=codec_replay_fn) -> list[dict]:
    """The driver loop of anchor.py: calibration first, fire + optimizer step, or one step per compressed
    minibatch (none with ``fast_step=false``); every metric from ``end_tick``. ``codec_replay(model, ctrl,
    opt, t)`` gives a fire's codec replay (or None)."""
    log = []
    for _ in range(ticks):
        t = ctrl.tick
        if ctrl.is_calibration_tick():
            ids, mask = tick_batch(t)[0]
            ctrl.calibrate(lambda ids=ids, mask=mask: model(input_ids=ids, attention_mask=mask.long()))
        if ctrl.is_fire_tick():
            ctrl.fire(dense_replay_fn(model, opt, t), codec_replay(model, ctrl, opt, t))
            opt.step()
        else:
            for j, (ids, mask) in enumerate(tick_batch(t)):
                opt.zero_grad()
                with ctrl.compressed(microbatch_id=j, token_mask=mask):
                    lm_loss(model, ids, mask).backward()
                ctrl.compress_gradients()
                if ctrl.is_update_tick():
                    opt.step()
        log.append(ctrl.end_tick())
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


def manual_replay(theta: dict[str, torch.Tensor], tick: int, bases=None):
    """The replay of ``tick`` by hand on a fresh model at ``theta``: each layer's output (``bases``: through
    ``(A Q) Q^T``) recorded; returns (grads, layer outputs, masks)."""
    manual = tiny_qwen2()
    with torch.no_grad():
        for n, p in manual.named_parameters():
            p.copy_(theta[n])
    seen = []

    def hook(point, module, args, out):
        A = out[0] if isinstance(out, tuple) else out
        seen.append(A.detach())
        if bases is None:
            return None
        A_hat = (A @ bases[point]) @ bases[point].T
        return (A_hat, *out[1:]) if isinstance(out, tuple) else A_hat

    for point, layer in enumerate(manual.model.layers):
        layer.register_forward_hook(lambda m, a, out, point=point: hook(point, m, a, out))
    masks = []
    for ids, mask in tick_batch(tick):
        (lm_loss(manual, ids, mask) / MICROBATCHES).backward()
        masks.append(mask)
    return {n: p.grad for n, p in manual.named_parameters()}, seen, masks


def global_cosine(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    x = torch.cat([a[n].reshape(-1) for n in b]).double()
    y = torch.cat([b[n].reshape(-1) for n in b]).double()
    return float(x @ y / (x.norm() * y.norm()))


def test_fire_applies_exactly_the_dense_update_at_the_projection():
    """At t = 2K: theta_proj = secant of the snapshots at 0 and K; p.grad = grad of the loss there;
    Q = orth(sum A^T A Q_old); M = beta M + (1 - beta) G; live weights back; then the step is dense. The
    tick's metrics: energy kept by Q_old per point, the gradient cosines of the fast circuit's update."""
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
    powersgd_before = copy.deepcopy(ctrl.powersgd)

    theta_proj = {n: secant_projection(snaps[K][n], snaps[0][n], K, 0, 2 * K, 1.0) for n in live}
    expected_grads, seen, masks = manual_replay(theta_proj, 2 * K)
    expected_bases, expected_energy = [], []
    for point in range(len(bases_before)):
        S = torch.zeros(HIDDEN, 8)
        kept = total = 0.0
        for A, mask in zip(seen[point::2], masks, strict=True):
            S += A[mask].T @ (A[mask] @ bases_before[point])
            kept += float((A[mask] @ bases_before[point]).square().sum())
            total += float(A[mask].square().sum())
        expected_bases.append(orth(S))
        expected_energy.append(kept / total)
    # the fast circuit's update on the same batch at theta_proj: codec path with Q_old, PowerSGD with the
    # error feedback and warm start of now, then the sign correction with the memory of now
    codec_grads, _, _ = manual_replay(theta_proj, 2 * K, bases_before)
    g_hat = {n: g.clone() for n, g in codec_grads.items()}
    copy.deepcopy(powersgd_before).compress_(g_hat)
    g_corr = {n: sign_correct(g, memory_before[n], 0.25) for n, g in g_hat.items()}

    ctrl.fire(dense_replay_fn(model, opt, 2 * K), codec_replay_fn(model, ctrl, opt, 2 * K))
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), live[n]), f"{n}: live weights not restored"
        torch.testing.assert_close(p.grad, expected_grads[n], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(
            ctrl.memory[n], 0.25 * memory_before[n] + 0.75 * p.grad, atol=1e-7, rtol=1e-6
        )
    for Q, Q_expected in zip(ctrl.codec.bases, expected_bases, strict=True):
        torch.testing.assert_close(Q, Q_expected, atol=1e-4, rtol=1e-4)
    assert set(ctrl.powersgd.error) == set(powersgd_before.error)  # the diagnostic left PowerSGD as it was
    for n, e in powersgd_before.error.items():
        assert torch.equal(ctrl.powersgd.error[n], e)
        assert torch.equal(ctrl.powersgd.q[n], powersgd_before.q[n])
    sgd_state = copy.deepcopy(opt.state_dict())
    opt.step()
    for n, p in model.named_parameters():
        buf = sgd_state["state"][list(live).index(n)]["momentum_buffer"]
        torch.testing.assert_close(
            p.detach(), live[n] - LR * (0.9 * buf + expected_grads[n]), atol=1e-6, rtol=1e-5
        )
    with pytest.raises(RuntimeError, match="fire tick"):
        ctrl.compress_gradients()
    metrics = ctrl.end_tick()
    assert metrics["anchor/fire"] == 1.0
    assert metrics["anchor/visible_snapshots"] == 2 and metrics["anchor/projection_distance"] > 0
    assert 0 < metrics["anchor/basis_overlap"] <= 1
    for point, energy in enumerate(expected_energy):
        assert metrics[f"codec/energy_captured/layer{point}"] == pytest.approx(energy, rel=1e-5)
    assert metrics["codec/energy_captured"] == pytest.approx(sum(expected_energy) / 2, rel=1e-5)
    raw_cos, corr_cos = global_cosine(g_hat, expected_grads), global_cosine(g_corr, expected_grads)
    assert metrics["anchor/grad_cosine_raw"] == pytest.approx(raw_cos, abs=1e-5)
    assert metrics["anchor/grad_cosine_corrected"] == pytest.approx(corr_cos, abs=1e-5)
    assert raw_cos < 0.99  # rank-8 activations and updates: not the dense gradient
    with pytest.raises(RuntimeError, match="fires at multiples"):
        ctrl.fire(lambda: None)


def test_grad_cosine_is_one_for_the_identity_codec_and_alpha_one():
    """codec identity, no weight codec, alpha = 1: the fast circuit's update is the dense gradient."""
    cfg = MethodConfig(codec="identity", grad_codec="none", alpha=1.0, rank=8, cadence=2)
    model, ctrl, opt = make(cfg)
    log = run_ticks(model, ctrl, opt, 3)
    for metrics in (log[0], log[2]):  # the first fire (no memory) and one with a memory
        assert metrics["anchor/grad_cosine_raw"] == pytest.approx(1.0, abs=1e-6)
        assert metrics["anchor/grad_cosine_corrected"] == pytest.approx(1.0, abs=1e-6)
        assert "codec/energy_captured" not in metrics and metrics["anchor/basis_overlap"] == 1.0
    assert "anchor/grad_cosine_raw" not in log[1] and "anchor/projection_distance" not in log[1]
    # alpha = 1 re-signs nothing; the agreement of the raw update with M is still read out
    assert 0 < log[1]["sign_memory/agreement"] < 1


def test_grad_cosine_off_needs_no_codec_replay_and_logs_none():
    model, ctrl, opt = make(MethodConfig(rank=8, cadence=2, grad_cosine_every=0))
    ctrl.fire(dense_replay_fn(model, opt, 0))
    metrics = ctrl.end_tick()
    assert "anchor/grad_cosine_raw" not in metrics and "anchor/projection_distance" in metrics
    _, on, _ = make(MethodConfig(rank=8, cadence=2))
    with pytest.raises(ValueError, match="codec_replay"):
        on.fire(dense_replay_fn(model, opt, 0))


@pytest.mark.parametrize(
    ("cadence", "every", "measured"),
    [
        (2, 10, [0, 10, 20, 30]),  # the tiny pair: 4 of its 20 fires
        (3, 10, [0, 12, 21, 30]),  # the first fire at or after each multiple of 10
        (5, 10, [0, 10, 20, 30]),
        (10, 10, [0, 10, 20, 30]),
        (20, 10, [0, 20]),  # every <= cadence: every fire
        (2, 1, list(range(0, 40, 2))),
        (2, 0, []),
    ],
)
def test_grad_cosine_due_picks_one_fire_per_window_of_ticks(cadence, every, measured):
    cfg = MethodConfig(cadence=cadence, grad_cosine_every=every)
    fires = range(0, 40, cadence)
    assert [t for t in fires if cfg.grad_cosine_due(t)] == measured


def test_skipped_cosine_fires_change_nothing_but_the_cosines():
    """grad_cosine_every = 4 at K = 2: the codec replay runs at fires 0 and 4 only, a fire in between needs
    none, and every other metric and the weights equal those of a run measuring every fire."""
    runs = {}
    for every in (1, 4):
        model, ctrl, opt = make(MethodConfig(rank=8, cadence=2, alpha=0.5, grad_cosine_every=every))
        replays: list[int] = []

        def counted(model, ctrl, opt, t, every=every, replays=replays):
            if every != 1 and t == 2:
                return None  # a fire the diagnostic skips needs no replay
            codec = codec_replay_fn(model, ctrl, opt, t)
            return lambda: (replays.append(t), codec())

        log = run_ticks(model, ctrl, opt, 6, counted)
        runs[every] = (replays, log, {k: v.clone() for k, v in model.state_dict().items()})
    (all_replays, all_log, all_weights), (few_replays, few_log, few_weights) = runs[1], runs[4]
    assert all_replays == [0, 2, 4] and few_replays == [0, 4]
    cosines = ("anchor/grad_cosine_raw", "anchor/grad_cosine_corrected")
    assert [all(k in m for k in cosines) for m in few_log] == [True, False, False, False, True, False]
    for every_fire, some_fires in zip(all_log, few_log, strict=True):
        rest = {k: v for k, v in every_fire.items() if k not in cosines}
        assert rest == {k: v for k, v in some_fires.items() if k not in cosines}
        assert all(some_fires[k] == every_fire[k] for k in cosines if k in some_fires)
    assert all(torch.equal(all_weights[k], few_weights[k]) for k in all_weights)


@pytest.mark.parametrize("alpha", [0.25, 0.75, 1.0])
def test_fast_tick_is_powersgd_then_sign_correction(alpha):
    """G_corr = sign_correct(PowerSGD(G), M, alpha); sign_memory/agreement counts sign(G_corr) = sign(M)
    where both are non-zero: exactly 1 for alpha < 0.5."""
    cfg = MethodConfig(rank=8, cadence=5, alpha=alpha)
    model, ctrl, opt = make(cfg)
    run_ticks(model, ctrl, opt, 1)  # the fire at t = 0 sets M = G_dense
    ids, mask = tick_batch(1)[0]
    opt.zero_grad()
    with ctrl.compressed(0, mask):
        lm_loss(model, ids, mask).backward()
    raw = {n: p.grad.clone() for n, p in model.named_parameters()}
    ctrl.compress_gradients()
    expected = {n: g.clone() for n, g in raw.items()}
    PowerSGD(rank=8, min_compression_rate=2.0, seed=cfg.seed).compress_(expected)
    agree = nonzero = 0
    for n, p in model.named_parameters():
        corrected = sign_correct(expected[n], ctrl.memory[n], alpha)
        torch.testing.assert_close(p.grad, corrected, atol=1e-6, rtol=1e-5)
        product = torch.sign(p.grad) * torch.sign(ctrl.memory[n])
        agree, nonzero = agree + int((product > 0).sum()), nonzero + int((product != 0).sum())
    assert not torch.equal(
        model.model.layers[0].mlp.up_proj.weight.grad, raw["model.layers.0.mlp.up_proj.weight"]
    )
    agreement = ctrl.end_tick()["sign_memory/agreement"]
    assert agreement == pytest.approx(agree / nonzero, abs=1e-12)
    if alpha < 0.5:
        assert agreement == 1.0
    else:  # G_corr keeps the compressed gradient's signs: one batch against the memory, about a coin flip
        assert 0.3 < agreement < 0.7


def test_anchor_off_calibrates_once_and_never_fires():
    model, ctrl, opt = make(MethodConfig(rank=8, anchor=False))
    initial = [Q.clone() for Q in ctrl.codec.bases]
    assert ctrl.is_calibration_tick() and not ctrl.is_fire_tick()
    before = weights(model)
    ids, mask = tick_batch(0)[0]
    ctrl.calibrate(lambda: model(input_ids=ids, attention_mask=mask.long()))
    assert not ctrl.is_calibration_tick()  # once: the tick's later passes use the calibrated basis
    with pytest.raises(RuntimeError, match="only once, at t = 0"):
        ctrl.calibrate(lambda: None)
    assert all(not torch.equal(a, b) for a, b in zip(initial, ctrl.codec.bases, strict=True))
    assert not ctrl.memory and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    calibrated = [Q.clone() for Q in ctrl.codec.bases]
    metrics = ctrl.end_tick()
    assert 0 < metrics["anchor/basis_overlap"] < 1 and metrics["anchor/fire"] == 0.0
    assert 0 < metrics["codec/energy_captured"] < 1  # of the random basis the sketch used
    log = run_ticks(model, ctrl, opt, 3)
    assert [m["anchor/fire"] for m in log] == [0, 0, 0] and not ctrl.memory
    assert all("anchor/basis_overlap" not in m and "sign_memory/agreement" not in m for m in log)
    assert all(torch.equal(a, b) for a, b in zip(calibrated, ctrl.codec.bases, strict=True))
    with pytest.raises(RuntimeError, match="only once, at t = 0"):
        ctrl.calibrate(lambda: None)


def test_fast_step_false_moves_the_weights_on_fire_ticks_only():
    """The anchor-only control: fast ticks run the fast circuit but take no (Adam) step at all."""
    cfg = MethodConfig(rank=8, cadence=3, fast_step=False)
    model = tiny_qwen2()
    ctrl = TwoCircuitController(model, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    moved = []
    for _ in range(5):  # fire, fast, fast, fire, fast
        before = weights(model)
        update = ctrl.is_update_tick()
        metrics = run_ticks(model, ctrl, opt, 1)[0]
        moved.append(any(not torch.equal(p, before[n]) for n, p in model.named_parameters()))
        assert update == bool(metrics["anchor/fire"])
    assert moved == [True, False, False, True, False]
    assert {int(state["step"]) for state in opt.state.values()} == {2}  # one Adam step per fire
    assert "sign_memory/agreement" in metrics  # the fast circuit still ran


def test_points_boundaries_leave_the_last_layer_uncompressed_and_uncounted():
    cfg = MethodConfig(rank=8, points="boundaries")
    model, ctrl, _ = make(cfg)
    assert ctrl.layer_ids == [0] and len(ctrl.codec.bases) == 1
    seen = []
    for layer in model.model.layers:
        layer.register_forward_hook(lambda m, a, out: seen.append(out[0] if isinstance(out, tuple) else out))
    ids, mask = tick_batch(0)[0]
    with torch.no_grad(), ctrl.compressed(0, mask):
        model(input_ids=ids, attention_mask=mask.long())
    Q = ctrl.codec.bases[0]
    torch.testing.assert_close(seen[0] @ Q @ Q.T, seen[0], atol=1e-5, rtol=1e-5)  # compressed
    assert (seen[1] @ Q @ Q.T - seen[1]).abs().max() > 1e-2  # the last layer's output: untouched
    assert ctrl.ledger.tick_bytes["activations_forward"] == int(mask.sum()) * 8 * 4  # one point
    fn = ctrl.sampler_codec_fn()
    A = torch.randn(5, HIDDEN)
    assert torch.equal(fn(1, A), A) and torch.allclose(fn(0, A), A @ Q @ Q.T)
    with pytest.raises(ConfigError, match=r"method\.points='boundaries'.*one decoder layer"):
        TwoCircuitController(tiny_qwen2(layers=1), cfg)
    assert compression_layers(3, "all") == [0, 1, 2] and compression_layers(3, "boundaries") == [0, 1]


def test_sign_scope_compressed_re_signs_the_compressed_matrices_only():
    cfg = MethodConfig(rank=8, cadence=5, sign_scope="compressed")
    model, ctrl, opt = make(cfg)
    run_ticks(model, ctrl, opt, 1)
    compressed = {n for n, p in model.named_parameters() if ctrl.powersgd.compresses(tuple(p.shape))}
    assert set(ctrl.memory.memory) == compressed == ctrl.sign_scope
    assert any(p.dim() == 1 for n, p in model.named_parameters() if n not in compressed)
    ids, mask = tick_batch(1)[0]
    opt.zero_grad()
    with ctrl.compressed(0, mask):
        lm_loss(model, ids, mask).backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    PowerSGD(rank=8, min_compression_rate=2.0, seed=cfg.seed).compress_(expected)
    ctrl.compress_gradients()
    for n, p in model.named_parameters():
        want = sign_correct(expected[n], ctrl.memory[n], 0.25) if n in compressed else expected[n]
        torch.testing.assert_close(p.grad, want, atol=1e-6, rtol=1e-5)
    assert ctrl.end_tick()["sign_memory/agreement"] == 1.0


@pytest.mark.parametrize(
    "cfg",
    [
        MethodConfig(rank=8, cadence=2, projection="secant"),
        MethodConfig(codec="prf_mask", rank=8, cadence=2, projection="relex", relex_window=3),
        MethodConfig(rank=8, cadence=3, projection="progressive", progressive_fires=2, delay=1),
        MethodConfig(rank=8, cadence=3, fast_step=False, sign_scope="compressed", points="boundaries"),
    ],
    ids=["lowrank-secant", "prf-relex", "progressive", "anchor-only-readings"],
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


def test_a_resume_puts_the_per_parameter_state_on_the_device_asked_for(monkeypatch):
    """verl's load with ``param_offload`` leaves the parameters on the CPU while the engine loads the
    controller, whose error, Q and memory then met the GPU's gradients at the next fast tick: ``device``
    places them where the parameters train. Here the parameters report ``meta`` while loading."""
    from commrl.compression import anchor

    cfg = MethodConfig(rank=8, cadence=2)
    model, ctrl, opt = make(cfg)
    run_ticks(model, ctrl, opt, 3)  # a fire and a fast tick: error, Q and memory exist
    state = ctrl.state_dict()
    monkeypatch.setattr(anchor, "local_tensor", lambda p: torch.empty(0, device="meta"))
    _, resumed, _ = make(cfg, seed=1)
    resumed.load_state_dict(state, device=torch.device("cpu"))
    buffers = [
        *resumed.powersgd.error.values(),
        *resumed.powersgd.q.values(),
        *resumed.memory.memory.values(),
    ]
    assert buffers and {b.device.type for b in buffers} == {"cpu"}
    _, at_params, _ = make(cfg, seed=1)
    at_params.load_state_dict(state)  # no device: beside each parameter, as before
    assert {b.device.type for b in at_params.powersgd.error.values()} == {"meta"}


def test_resume_with_other_settings_is_refused():
    _, ctrl, _ = make(MethodConfig(rank=8, cadence=2))
    _, other, _ = make(MethodConfig(rank=8, cadence=3))
    with pytest.raises(ValueError, match="cadence"):
        other.load_state_dict(ctrl.state_dict())


@pytest.mark.parametrize(
    ("codec", "points", "prf_keep"),
    [
        ("lowrank", "all", None),
        ("prf_mask", "all", None),
        ("identity", "all", None),
        ("lowrank", "boundaries", None),
        ("prf_mask", "boundaries", 0.5),
    ],
)
def test_ledger_equals_the_analytic_formula(codec, points, prf_keep):
    """Also under points=boundaries (the last layer's output is no communicated tensor: one point of two)
    and a given prf_keep (p * tokens * d per point and pass)."""
    K = 3
    cfg = MethodConfig(codec=codec, rank=8, cadence=K, points=points, prf_keep=prf_keep)
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
        prf_keep=prf_keep,
        points=points,
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
        ctrl.fire(broken_replay, codec_replay_fn(model, ctrl, opt, 4))
    assert all(torch.equal(p, live[n]) for n, p in model.named_parameters())
