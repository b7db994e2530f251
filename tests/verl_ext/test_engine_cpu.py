"""The two-circuit engine inside verl's real ``ActorRolloutRefWorker`` on CPU (verl_cpu_harness).

Only the GPU is replaced: a CPU platform registered through verl's plugin API, gloo collectives, and a plain
(non-FSDP) build of ``FSDPEngineWithLMHead`` -- or verl's real FSDP2 engine where marked -- under the same
commrl mixin that ``TwoCircuitFSDPEngine`` puts on the GPU engine.
"""

from __future__ import annotations

import copy
import math
import multiprocessing

import pytest
import torch

from commrl.errors import ConfigError
from commrl.verl_ext import TwoCircuitFSDPEngine
from commrl.verl_ext.config import method_to_env
from commrl.verl_ext.engine import (
    ANCHOR_ADV_KEY,
    ANCHOR_IS_KEY,
    ANCHOR_MASK_KEY,
    DENSE_REF_KEY,
    DENSE_REFERENCE,
    OLD_PASS,
)

DENSE = dict(codec="identity", grad_codec="none", anchor=False, projection="none")
HALF = 8  # rows per optimizer step: two mini-batches per tick on the 16-row batch


def test_registry_resolves_commrl_engine_for_nvidia_gpus(monkeypatch):
    """With ``commrl.verl_ext`` imported, (cuda, nvidia) resolves to the commrl engine, both strategies."""
    from verl.workers.engine import EngineRegistry

    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cuda")
    monkeypatch.setenv("VERL_ENGINE_VENDOR", "nvidia")
    for backend in ("fsdp", "fsdp2"):
        assert EngineRegistry.get_engine_cls("language_model", backend) is TwoCircuitFSDPEngine


def test_dense_condition_matches_stock_engine_exactly(cpu_verl, tiny_model_dir, method):
    """Identity codec: verl's stock engine's log-probs, reference log-probs and weights after two updates."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir)
    stock, stock_ref = (cpu_verl.build_worker(cfg, role, "stock") for role in ("actor", "ref"))
    method(**DENSE)
    ours, our_ref = (cpu_verl.build_worker(cfg, role, "commrl") for role in ("actor", "ref"))
    assert cpu_verl.engine_of(ours).controller is not None
    batch = cpu_verl.training_batch(stock)
    assert torch.equal(cpu_verl.log_probs(ours, batch), cpu_verl.log_probs(stock, batch))
    assert torch.equal(
        cpu_verl.log_probs(our_ref, batch, ref=True), cpu_verl.log_probs(stock_ref, batch, ref=True)
    )

    stock_hist = cpu_verl.run_ticks(stock, copy.deepcopy(batch), 2, HALF)
    our_hist = cpu_verl.run_ticks(ours, copy.deepcopy(batch), 2, HALF)
    theirs, mine = (
        cpu_verl.full_params(cpu_verl.engine_of(stock)),
        cpu_verl.full_params(cpu_verl.engine_of(ours)),
    )
    assert all(torch.equal(theirs[name], mine[name]) for name in theirs)
    assert stock_hist[1]["actor/pg_loss"] == our_hist[1]["actor/pg_loss"]
    assert our_hist[1]["comm/ratio_vs_dense"] == [1.0]
    assert "comm/bytes_total" not in stock_hist[1]


def test_lowrank_changes_log_probs_and_logs_comm_metrics(cpu_verl, tiny_model_dir, method):
    """lowrank: the log-probs leave the stock ones; each tick returns comm/* and anchor/fire lists."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir)
    stock = cpu_verl.build_worker(cfg, "actor", "stock")
    method(codec="lowrank", cadence=2)
    ours = cpu_verl.build_worker(cfg, "actor", "commrl")
    batch = cpu_verl.training_batch(stock)
    mask = batch.batch["response_mask"].bool()
    gap = (cpu_verl.log_probs(ours, batch) - cpu_verl.log_probs(stock, batch))[mask].abs().mean()
    assert gap > 1e-2
    history = cpu_verl.run_ticks(ours, batch, 2, HALF)
    for metrics in history:
        for key in (
            "comm/bytes_activations",
            "comm/bytes_weights",
            "comm/bytes_total",
            "comm/bytes_cumulative",
            "comm/ratio_vs_dense",
            "anchor/fire",
        ):
            assert isinstance(metrics[key], list), key
    fast = history[1]
    assert fast["anchor/fire"] == [0.0]
    assert fast["comm/bytes_total"][0] < 0.6 * fast["comm/bytes_dense"][0]
    assert history[0]["comm/bytes_anchor"][0] > 0  # tick 0 fires: replay, dense update, basis refresh


def test_anchor_fires_at_0_K_2K(cpu_verl, tiny_model_dir, method):
    """K = 2: fires at ticks 0, 2, 4 (replay at ratio one: ppo_kl = 0), compressed in between; 5 counted."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir)
    method(codec="lowrank", cadence=2)
    worker = cpu_verl.build_worker(cfg, "actor", "commrl")
    history = cpu_verl.run_ticks(worker, cpu_verl.training_batch(worker), 5, HALF)
    assert [m["anchor/fire"][-1] for m in history] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert [m["comm/bytes_basis_refresh"][-1] > 0 for m in history] == [True, False, True, False, True]
    assert history[2]["anchor/visible_snapshots"] == [1.0]  # h = K: the tick-0 snapshot is visible at tick 2
    assert history[2]["actor/ppo_kl"][0] == 0.0  # the fire's replay: old log-probs := its own
    assert cpu_verl.engine_of(worker).controller.tick == 5


def test_reference_goes_through_the_actors_codec(cpu_verl, tiny_model_dir, method):
    """kl_ref_forward=codec: the reference's log-probs equal the actor's compressed ones (same masks)."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir)
    method(codec="prf_mask", anchor=False)
    actor = cpu_verl.build_worker(cfg, "actor", "commrl")
    ref = cpu_verl.build_worker(cfg, "ref", "commrl")
    batch = cpu_verl.training_batch(actor)
    compressed = cpu_verl.log_probs(actor, batch)
    assert torch.equal(cpu_verl.log_probs(ref, batch, ref=True), compressed)

    stock_ref = cpu_verl.build_worker(cfg, "ref", "stock")
    stock = cpu_verl.log_probs(stock_ref, batch, ref=True)
    # the trainer's dense request on a fire tick (DENSE_REFERENCE): the same engine, no codec
    assert torch.equal(cpu_verl.log_probs(ref, batch, ref=True, **{DENSE_REFERENCE: True}), stock)

    method(codec="prf_mask", anchor=False, kl_ref_forward="dense")
    dense_ref = cpu_verl.build_worker(cfg, "ref", "commrl")
    dense = cpu_verl.log_probs(dense_ref, batch, ref=True)
    assert torch.equal(dense, stock)
    assert not torch.equal(dense, compressed)


def test_fire_ticks_take_the_kl_term_against_the_dense_reference(cpu_verl, tiny_model_dir, method):
    """A fire tick's updates (the replay, then a dense mini-batch) read DENSE_REF_KEY, not the batch's codec
    ``ref_log_prob``; a fast tick reads ``ref_log_prob``. Without the dense key a fire refuses to train."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir)
    method(codec="lowrank", cadence=2)

    def weights(ref: float, dense: float, ticks: int) -> dict[str, torch.Tensor]:
        worker = cpu_verl.build_worker(cfg, "actor", "commrl")
        batch = cpu_verl.training_batch(worker)
        batch.batch["ref_log_prob"].fill_(ref)
        batch.batch[DENSE_REF_KEY].fill_(dense)
        cpu_verl.run_ticks(worker, batch, ticks, HALF)
        return cpu_verl.full_params(cpu_verl.engine_of(worker))

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(a[name], b[name]) for name in a)

    base = weights(-2.0, -2.0, 1)  # tick 0 fires
    assert same(weights(-7.0, -2.0, 1), base)
    assert not same(weights(-2.0, -7.0, 1), base)
    assert not same(weights(-7.0, -2.0, 2), weights(-2.0, -2.0, 2))  # tick 1 is fast: the codec reference

    worker = cpu_verl.build_worker(cfg, "actor", "commrl")
    batch = cpu_verl.training_batch(worker)
    batch.batch.pop(DENSE_REF_KEY)
    with pytest.raises(ConfigError, match=r"commrl_ref_log_prob_dense.*kl_ref_forward=dense"):
        cpu_verl.run_ticks(worker, batch, 1, HALF)


def test_fire_ticks_extra_old_passes_dense_counted_and_readout_uncounted(cpu_verl, tiny_model_dir, method):
    """The trainer's extra old-log-prob passes on a fire tick (OLD_PASS): ``dense`` gives the stock engine's
    log-probs and adds one dense forward to the tick's bytes (the local driver's dense old pass);
    ``readout`` gives the codec's log-probs and adds nothing (an uncounted read-out)."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir)
    stock = cpu_verl.build_worker(cfg, "actor", "stock")
    method(codec="lowrank", cadence=2)
    batch = cpu_verl.training_batch(stock)

    def fire_tick(*passes: str):
        worker = cpu_verl.build_worker(cfg, "actor", "commrl")
        tick = copy.deepcopy(batch)
        tick.batch["old_log_probs"] = cpu_verl.log_probs(worker, tick)
        extra = {mode: cpu_verl.log_probs(worker, tick, **{OLD_PASS: mode}) for mode in passes}
        metrics = cpu_verl.update(worker, tick, cpu_verl.BATCH)
        return metrics, {"infer": tick.batch["old_log_probs"], **extra}, cpu_verl.engine_of(worker).controller

    plain, _, _ = fire_tick()
    metrics, log_probs, ctrl = fire_tick("dense", "readout")
    assert torch.equal(log_probs["dense"], cpu_verl.log_probs(stock, batch))
    assert torch.equal(log_probs["readout"], log_probs["infer"])
    assert not torch.equal(log_probs["readout"], log_probs["dense"])
    tokens = int(batch.batch["attention_mask"].sum())
    dense_forward = len(ctrl.layer_ids) * tokens * ctrl.hidden * 4  # every point, every real token, fp32
    for key in ("comm/bytes_activations", "comm/bytes_dense"):
        assert metrics[key][0] - plain[key][0] == dense_forward, key
    assert metrics["comm/bytes_anchor"] == plain["comm/bytes_anchor"]


def test_fire_replay_takes_the_anchor_inputs(cpu_verl, tiny_model_dir, method):
    """Decoupled correction on a fire tick: the replay's loss reads ANCHOR_MASK_KEY (its mask and verl's
    token count), ANCHOR_ADV_KEY and ANCHOR_IS_KEY (none without it), not the batch's response_mask,
    advantages and rollout_is_weights (the compressed correction's); a fast tick ignores the anchor keys."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir)
    method(codec="lowrank", cadence=2)

    def run(ticks: int = 1, anchor_is: bool = True, edit_batch: bool = False, edit_anchor: bool = False):
        worker = cpu_verl.build_worker(cfg, "actor", "commrl")
        batch = cpu_verl.training_batch(worker)
        tensors, gen = batch.batch, torch.Generator().manual_seed(1)
        anchor_mask = tensors["response_mask"].clone()
        anchor_mask[[1, 6, 11, 12]] = 0  # the dense correction's rejection
        tensors[ANCHOR_MASK_KEY], tensors[ANCHOR_ADV_KEY] = anchor_mask, tensors["advantages"] * 1.5
        if anchor_is:
            tensors[ANCHOR_IS_KEY] = torch.rand(anchor_mask.shape, generator=gen)
        if edit_batch:  # another (compressed) correction: rejection, advantages, weights
            tensors["response_mask"] = tensors["response_mask"].clone()  # a view of attention_mask
            tensors["response_mask"][[0, 2, 3]] = 0
            tensors["advantages"] = tensors["advantages"] * 3.0
            tensors["rollout_is_weights"] = torch.rand(anchor_mask.shape, generator=gen)
        keys = set(tensors.keys()) & {ANCHOR_MASK_KEY, ANCHOR_ADV_KEY, ANCHOR_IS_KEY}
        anchor = {key: tensors[key].clone() for key in keys}
        history = cpu_verl.run_ticks(worker, batch, 1, cpu_verl.BATCH)
        if ticks == 2:
            if edit_anchor:
                tensors[ANCHOR_MASK_KEY][[0, 5]] = 0
                tensors[ANCHOR_ADV_KEY] = tensors[ANCHOR_ADV_KEY] * -2.0
            history += cpu_verl.run_ticks(worker, batch, 1, cpu_verl.BATCH)
        return history, cpu_verl.full_params(cpu_verl.engine_of(worker)), anchor

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(a[name], b[name]) for name in a)

    def replay_loss(anchor: dict[str, torch.Tensor]) -> float:  # ratio one: token-mean of -A * w
        mask, weights = anchor[ANCHOR_MASK_KEY].bool(), anchor.get(ANCHOR_IS_KEY, 1.0)
        return float(-(anchor[ANCHOR_ADV_KEY] * weights * mask).sum() / mask.sum())

    history, fired, anchor = run()
    assert history[0]["actor/pg_loss"] == [pytest.approx(replay_loss(anchor), abs=1e-6)]
    assert same(run(edit_batch=True)[1], fired)
    history, _, anchor = run(anchor_is=False, edit_batch=True)
    assert history[0]["actor/pg_loss"] == [pytest.approx(replay_loss(anchor), abs=1e-6)]
    assert same(run(ticks=2, edit_anchor=True)[1], run(ticks=2)[1])  # tick 1 is fast: the batch's keys


def test_prf_masks_of_old_and_training_passes_agree(cpu_verl, tiny_model_dir, method):
    """prf_mask, lr = 0: both mini-batches see the old-log-prob pass's masks, so the ratio is exactly one."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir, extra=("actor_rollout_ref.actor.optim.lr=0.0",))
    method(codec="prf_mask", anchor=False)
    worker = cpu_verl.build_worker(cfg, "actor", "commrl")
    metrics = cpu_verl.run_ticks(worker, cpu_verl.training_batch(worker), 1, HALF)[0]
    assert len(metrics["actor/ppo_kl"]) == 2
    assert metrics["actor/ppo_kl"] == [0.0, 0.0]
    assert metrics["actor/pg_clipfrac"] == [0.0, 0.0]


def test_each_data_parallel_rank_keys_its_prf_masks_by_its_own_micro_batches(
    cpu_verl, tiny_model_dir, method, monkeypatch
):
    """method.md §2 keys a PRF mask by micro-batch: rank r of D numbers its j-th micro-batch of a pass
    j D + r, so two ranks never draw the same masks (they did: each counted from 0); one rank keeps j. The
    old-log-prob pass and the training pass of a tick use the same keys (their masks agree)."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir, extra=("actor_rollout_ref.actor.optim.lr=0.0",))
    method(codec="prf_mask", anchor=False)
    worker = cpu_verl.build_worker(cfg, "actor", "commrl")
    engine, batch = cpu_verl.engine_of(worker), cpu_verl.training_batch(worker)
    keys: list[int] = []
    compressed = engine.controller.compressed

    def spy(microbatch_id=0, **kwargs):
        keys.append(microbatch_id)
        return compressed(microbatch_id=microbatch_id, **kwargs)

    monkeypatch.setattr(engine.controller, "compressed", spy)
    cpu_verl.run_ticks(worker, batch, 1, HALF)
    one_rank = list(keys)
    assert one_rank and sorted(set(one_rank)) == list(range(len(set(one_rank))))
    keys.clear()
    monkeypatch.setattr(type(engine), "get_data_parallel_size", lambda self: 2)
    monkeypatch.setattr(type(engine), "get_data_parallel_rank", lambda self: 1)
    metrics = cpu_verl.run_ticks(worker, batch, 1, HALF)[0]
    assert keys == [2 * j + 1 for j in one_rank]
    assert set(metrics["actor/ppo_kl"]) == {0.0}  # lr 0: the training pass saw the old pass's masks


def test_anchor_off_calibrates_the_basis_once(cpu_verl, tiny_model_dir, method):
    """anchor_off: tick 0 refreshes Q from a dense sketch, later ticks keep it; no fire, no dense memory."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir)
    method(codec="lowrank", anchor=False, projection="none")
    worker = cpu_verl.build_worker(cfg, "actor", "commrl")
    ctrl = cpu_verl.engine_of(worker).controller
    initial = [q.clone() for q in ctrl.codec.bases]
    batch = cpu_verl.training_batch(worker)
    cpu_verl.run_ticks(worker, batch, 1, HALF)
    calibrated = [q.clone() for q in ctrl.codec.bases]
    history = cpu_verl.run_ticks(worker, batch, 2, HALF)
    assert not any(torch.equal(a, b) for a, b in zip(initial, calibrated, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(calibrated, ctrl.codec.bases, strict=True))
    assert [m["anchor/fire"][-1] for m in history] == [0.0, 0.0]
    assert not ctrl.memory


def test_checkpoint_resume_is_bit_identical(cpu_verl, tiny_model_dir, method, tmp_path):
    """FSDP2 engine: save after 3 ticks, load into a fresh worker; tick 4: identical weights and bytes."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir, strategy="fsdp2")
    method(codec="lowrank", cadence=2)
    first = cpu_verl.build_worker(cfg, "actor", "commrl")
    batch = cpu_verl.training_batch(first)
    cpu_verl.run_ticks(first, batch, 3, HALF)
    ckpt = tmp_path / "global_step_3" / "actor"
    first.save_checkpoint(str(ckpt), global_step=3)
    assert (ckpt / "commrl_controller_rank0.pt").exists()
    second = cpu_verl.build_worker(cfg, "actor", "commrl")
    second.load_checkpoint(str(ckpt))
    assert cpu_verl.engine_of(second).controller.tick == 3
    a = cpu_verl.run_ticks(first, copy.deepcopy(batch), 1, HALF)[0]
    b = cpu_verl.run_ticks(second, copy.deepcopy(batch), 1, HALF)[0]
    pa, pb = cpu_verl.full_params(cpu_verl.engine_of(first)), cpu_verl.full_params(cpu_verl.engine_of(second))
    assert all(torch.equal(pa[name], pb[name]) for name in pa)
    assert a["comm/bytes_cumulative"] == b["comm/bytes_cumulative"]


def test_anchor_refuses_fsdp2_without_reshard_after_forward(cpu_verl, tiny_model_dir, method):
    """verl's FSDP2 engine with reshard_after_forward=False keeps the old-log-prob pass's gathered weights
    (unlike verl's default), so the fire's replay would not see the view loaded into the shards: the build
    fails, naming the key."""
    key = "actor_rollout_ref.actor.fsdp_config.reshard_after_forward"
    default = cpu_verl.actor_rollout_ref_config(tiny_model_dir, strategy="fsdp2")
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir, strategy="fsdp2", extra=(f"{key}=False",))
    for config, gathered in ((default, False), (cfg, True)):
        stock = cpu_verl.build_worker(config, "actor", "stock")
        cpu_verl.log_probs(stock, cpu_verl.training_batch(stock))
        assert bool(cpu_verl.unsharded_fsdp_modules(cpu_verl.engine_of(stock).module)) == gathered
    method(codec="lowrank", cadence=2)
    with pytest.raises(ConfigError, match=f"{key}=True"):
        cpu_verl.build_worker(cfg, "actor", "commrl")
    method(codec="lowrank", anchor=False, projection="none")  # no fire, nothing loaded into the shards
    assert cpu_verl.engine_of(cpu_verl.build_worker(cfg, "actor", "commrl")).controller is not None


@pytest.mark.slow
def test_two_gloo_ranks_fsdp2_give_the_unsharded_result(cpu_verl, tiny_model_dir, method, tmp_path):
    """method (lowrank + PowerSGD + sign memory + anchor, K = 2), 3 ticks: verl's FSDP2 engine on two gloo
    ranks (DTensor gradient shards, sketches and PowerSGD factors all-reduced) against the plain engine on
    one rank with the whole batch. SGD, so that the weights show the gradients (Adam turns float noise in
    ~0 entries into whole steps)."""
    cfg = method(codec="lowrank", cadence=2, grad_rank=4)
    sgd = ("actor_rollout_ref.actor.optim.optimizer=SGD", "actor_rollout_ref.actor.optim.lr=0.5")
    out = tmp_path / "rank0.pt"
    ctx = multiprocessing.get_context("spawn")
    args = (str(tmp_path / "store"), str(tiny_model_dir), method_to_env(cfg), 3, str(out), sgd)
    procs = [ctx.Process(target=cpu_verl.sharded_run, args=(rank, 2, *args)) for rank in range(2)]
    for p in procs:
        p.start()
    worker = cpu_verl.build_worker(
        cpu_verl.actor_rollout_ref_config(tiny_model_dir, extra=sgd), "actor", "commrl"
    )
    initial = cpu_verl.full_params(cpu_verl.engine_of(worker))
    history = cpu_verl.run_ticks(worker, cpu_verl.training_batch(worker), 3, cpu_verl.BATCH)
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    sharded = torch.load(out, weights_only=False)
    whole = cpu_verl.full_params(cpu_verl.engine_of(worker))
    moved = max(float((whole[name] - initial[name]).abs().max()) for name in whole)
    assert moved > 1e-3
    for name, value in whole.items():
        torch.testing.assert_close(sharded["params"][name], value, atol=1e-5, rtol=1e-4, msg=name)
    for tick in range(3):  # lists: one entry per data-parallel rank; bytes summed over the ranks' tokens
        for key in ("comm/bytes_weights", "comm/bytes_activations", "anchor/fire"):
            assert set(sharded["history"][tick][key]) == set(history[tick][key]), (tick, key)


@pytest.mark.parametrize("codec", ["lowrank", "prf_mask"])
def test_gradient_checkpointing_changes_nothing(cpu_verl, tiny_model_dir, method, codec):
    """HF gradient checkpointing re-runs each layer in the backward: the codec must be re-applied there
    (same basis, same mask) and its bytes not counted twice -- identical weights and ledger either way."""
    method(codec=codec, cadence=2)
    runs = []
    for checkpointing in (False, True):
        extra = (f"actor_rollout_ref.model.enable_gradient_checkpointing={checkpointing}",)
        cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir, extra=extra)
        worker = cpu_verl.build_worker(cfg, "actor", "commrl")
        history = cpu_verl.run_ticks(worker, cpu_verl.training_batch(worker), 2, HALF)
        runs.append((cpu_verl.full_params(cpu_verl.engine_of(worker)), history))
    (plain, plain_hist), (ckpt, ckpt_hist) = runs
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)
    for tick in range(2):
        assert ckpt_hist[tick]["comm/bytes_activations"] == plain_hist[tick]["comm/bytes_activations"], tick


def test_a_fully_masked_mini_batch_steps_on_a_zero_gradient_and_keeps_the_codec_finite(
    cpu_verl, tiny_model_dir, method
):
    """A mini-batch whose every token is masked (verl's decoupled rejection can drop them all) has verl's
    token-mean 0 / 0: NaN gradients, which PowerSGD's error feedback and the sign memory would keep. Its loss
    is 0 and its gradient 0, as the local driver's, and the next mini-batch trains as before."""
    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir)
    method(codec="lowrank", cadence=4)
    worker = cpu_verl.build_worker(cfg, "actor", "commrl")
    batch = cpu_verl.training_batch(worker)
    cpu_verl.run_ticks(worker, batch, 1, HALF)  # tick 0 fires
    mask = batch.batch["response_mask"].clone()  # a view of attention_mask: zero the response mask alone
    mask[:HALF] = 0  # the first mini-batch of each later tick: no token left
    batch.batch["response_mask"] = mask
    history = cpu_verl.run_ticks(worker, batch, 2, HALF)
    engine = cpu_verl.engine_of(worker)
    for metrics in history:
        assert metrics["actor/pg_loss"][0] == 0.0 and all(map(math.isfinite, metrics["actor/pg_loss"]))
        (norm,) = (v for k, v in metrics.items() if k.endswith("grad_norm"))
        assert all(map(math.isfinite, norm))
    state = engine.controller.state_dict()
    kept = [*state["powersgd"]["error"].values(), *state["memory"].values()]
    assert kept and all(torch.isfinite(t).all() for t in kept)
    assert all(torch.isfinite(p).all() for p in cpu_verl.full_params(engine).values())


def test_a_non_finite_gradient_stops_the_run_before_the_codec_keeps_it(cpu_verl, tiny_model_dir, method):
    """verl skips a step whose gradient norm is not finite; the codec's error feedback would keep the NaN and
    every later step would be skipped: the engine raises, naming the tick, as the local driver does."""
    from commrl.rl.health import NonFiniteLossError

    cfg = cpu_verl.actor_rollout_ref_config(tiny_model_dir)
    method(codec="lowrank", cadence=4)
    worker = cpu_verl.build_worker(cfg, "actor", "commrl")
    batch = cpu_verl.training_batch(worker)
    cpu_verl.run_ticks(worker, batch, 1, HALF)  # tick 0 fires
    batch.batch["advantages"][0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match=r"non-finite gradient norm \(nan\) at tick 1"):
        cpu_verl.run_ticks(worker, batch, 1, HALF)
