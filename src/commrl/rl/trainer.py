"""The local driver: two-circuit GRPO on one machine (the embedded default's trainer).

One tick (method.md §1-3):
  sample n responses per prompt with the true weights -> verifiable rewards -> GRPO advantages (verl) ->
  old / reference log-probs through the codec -> mismatch read-outs ->
  fire tick:  the anchor's dense replay at the projected stale weights -> dense update;
  fast tick:  per mini-batch, forward/backward through the codec -> PowerSGD + sign correction -> update ->
  push the new weights to the sampler; validate every ``val_every`` ticks; checkpoint every ``every`` ticks.

Every forward pass of the trainer runs a micro-batch in the shared-prefix layout (``commrl.rl.packing``): each
prompt once, no padding; it computes the padded layout's log-probs on fewer tokens.

Metrics reach MLflow at each checkpoint, from the same state the checkpoint holds, so a rerun after a
kill resumes into the same MLflow run with exactly one value per tick.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from commrl import tracking
from commrl.errors import ConfigError
from commrl.eval.atomic import write_lines_atomic
from commrl.rl import correction, grpo
from commrl.rl.batch import RolloutBatch, build_batch, micro_batches
from commrl.rl.checkpoint import CheckpointStore
from commrl.rl.config import TrainConfig
from commrl.rl.health import CollapseMonitor, NonFiniteLossError, check_finite
from commrl.rl.logprobs import response_log_probs
from commrl.rl.mismatch import mismatch_metrics
from commrl.rl.packing import use_shared_prefix_attention
from commrl.rl.reward import boxed_reward
from commrl.rl.sampler import HFSampler, Sampler, SamplerCodec, VLLMSampler
from commrl.rl.staleness import WeightHistory, behaviour_version
from commrl.rl.timing import PhaseTimer
from commrl.run import fingerprint, preempt, record
from commrl.run.hooks import StopTraining, TrainCallbacks
from commrl.run.record import RunSpec
from commrl.run.summary import FINAL_DIR, RunSummary, read_point, read_point_dir_name
from commrl.staging import staged_dir

SENTINEL_METRIC = "time/step_s"  # logged every tick: the newest step in MLflow is its newest step


@dataclass
class PromptSet:
    """Chat-templated prompt token ids and ground truths of one split."""

    token_ids: list[list[int]]
    ground_truths: list[str]

    def __len__(self) -> int:
        return len(self.token_ids)


def load_prompts(path: Path, tokenizer, limit: int = 0) -> PromptSet:
    """Read a verl-schema parquet split; the chat template is applied here, as verl's AgentLoop does."""
    if not path.is_file():
        raise ConfigError(f"data file {path} does not exist; prepare it with `commrl prepare` (data.dir)")
    frame = pd.read_parquet(path)
    for column in ("prompt", "reward_model"):
        if column not in frame.columns:
            raise ConfigError(f"{path} has no column {column!r}: not a verl-schema dataset (commrl prepare)")
    if limit:
        frame = frame.iloc[:limit]
    ids, truths = [], []
    for prompt, reward in zip(frame["prompt"], frame["reward_model"], strict=True):
        messages = [dict(m) for m in prompt]
        ids.append(
            list(
                tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
        )
        truths.append(str(reward["ground_truth"]))
    return PromptSet(ids, truths)


def tick_prompt_indices(n_prompts: int, per_tick: int, tick: int, seed: int) -> list[int]:
    """The prompts of ``tick``: consecutive slices of per-epoch permutations (pure in seed and tick)."""
    start = tick * per_tick
    out: list[int] = []
    while len(out) < per_tick:
        epoch, offset = divmod(start + len(out), n_prompts)
        order = np.random.default_rng([seed, epoch]).permutation(n_prompts)
        take = min(per_tick - len(out), n_prompts - offset)
        out.extend(int(i) for i in order[offset : offset + take])
    return out


class LocalTrainer:
    """Trains one (pair, condition, seed) run; ``train()`` resumes from the newest checkpoint if any, unless
    it was trained under another config (``commrl.run.fingerprint``)."""

    def __init__(self, cfg: TrainConfig, run: RunSpec | None = None, callbacks: TrainCallbacks | None = None):
        self.cfg = cfg
        self.run = run or RunSpec()
        self.callbacks = callbacks or TrainCallbacks()
        self.out = cfg.out_path.resolve()  # the summary's paths hold from any working directory
        self.store = CheckpointStore(self.out / "checkpoints", keep=cfg.checkpoint.keep)
        self.pending: list[tuple[int, dict[str, float]]] = []
        self.val_acc: dict[int, float] = {}
        self.run_id: str | None = None
        self.monitor = CollapseMonitor(cfg.health)
        self.timer = PhaseTimer()
        self._step = 0
        self._resumed_from = 0  # the tick the run (re)started from: later ticks are this attempt's own
        self.weights = WeightHistory(cfg.rl.staleness)
        self._version = 0  # the live weights' version: ticks trained (commrl.rl.staleness)
        self._sampler_version: int | None = None  # the version the sampler holds
        self.run_config = fingerprint.of(cfg.resolved())  # what a resume must match

    # ------------------------------------------------------------------ set-up
    def _setup(self) -> None:
        with self.timer.phase("setup_models"):
            self._build_models()
        with self.timer.phase("setup_sampler"):
            self.sampler = self._build_sampler()
        use_shared_prefix_attention(self.model)  # after the HF sampler copied the model: it generates on sdpa
        use_shared_prefix_attention(self.ref)

    def _build_models(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from commrl.compression import TwoCircuitController

        cfg = self.cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        path = Path(cfg.model.path)
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"model.path={cfg.model.path} is not a model directory (no config.json); for the tiny pair "
                "build it with `commrl pretrain` (snakemake results/models/tiny-base/base_accuracy.json)"
            )
        torch.manual_seed(cfg.seed)
        dtype = getattr(torch, cfg.model.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attention_dropout=cfg.model.attention_dropout, attn_implementation="sdpa"
        )
        self.ref = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").eval()
        for p in self.ref.parameters():
            p.requires_grad_(False)
        self.method = cfg.method_config(hidden_size=self.model.config.hidden_size)
        self.ctrl = TwoCircuitController(self.model, self.method)
        self.ctrl.attach(self.ref)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.rl.lr, betas=tuple(cfg.rl.betas), weight_decay=cfg.rl.weight_decay
        )
        data_dir = Path(cfg.data.dir)
        self.train_set = load_prompts(data_dir / cfg.data.train_file, self.tokenizer)
        self.val_set = load_prompts(data_dir / cfg.data.val_file, self.tokenizer, cfg.data.val_limit)
        if len(self.train_set) < cfg.rl.prompts_per_tick:
            raise ConfigError(
                f"rl.prompts_per_tick={cfg.rl.prompts_per_tick} exceeds the {len(self.train_set)} "
                "training prompts"
            )
        per_mini = cfg.rl.prompts_per_tick // cfg.rl.mini_batches * cfg.rl.group_size  # RLConfig checks it
        self.micro = min(cfg.rl.micro_batch_size, per_mini)
        self.per_mini = per_mini
        self.actor_cfg = grpo.actor_config(cfg.rl, per_mini)
        self.sampler_codec = SamplerCodec() if cfg.sampler.codec == "same" else None
        self.forward_is_deterministic = cfg.model.attention_dropout == 0 and not any(
            isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.model.modules()
        )
        self.bypass = cfg.rl.behaviour_logprobs == "sampler"  # verl's bypass mode: old = sampler log-probs
        self.correction = cfg.rl.rollout_correction
        self.decoupled_correction = self.correction.enabled and not self.bypass

    def _build_sampler(self) -> Sampler:
        cfg = self.cfg
        longest = max(len(p) for p in self.train_set.token_ids + self.val_set.token_ids)
        need = longest + cfg.sampler.max_new_tokens
        limit = self.model.config.max_position_embeddings
        if need > limit:
            raise ConfigError(
                f"prompts of {longest} tokens + sampler.max_new_tokens={cfg.sampler.max_new_tokens} "
                f"exceed the model's {limit} positions; lower sampler.max_new_tokens"
            )
        if cfg.sampler.backend == "vllm":
            return VLLMSampler(
                cfg.model.path,
                cfg.model.dtype,
                min(limit, need + 8),
                cfg.seed,
                cfg.sampler.kv_cache_gib,
                cfg.sampler.gpu_memory_utilization,
                self.sampler_codec,
            )
        return HFSampler(
            self.model, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, self.sampler_codec
        )

    # ------------------------------------------------------------------ tracking
    def _identity(self) -> record.RunIdentity:
        cfg = self.cfg
        return record.RunIdentity(
            cfg.pair, cfg.condition, cfg.seed, self.method.codec, "local", cfg.rl.ticks, cfg.rl.read_at
        )

    def _start_tracking(self, resumed_run_id: str | None) -> None:
        """Open (or reopen) the run's MLflow run; log the config (new keys; changed ones are recorded)."""
        if not self.cfg.tracking.enabled:
            return
        self.tracking_uri = self.cfg.tracking.uri or tracking.default_tracking_uri()
        self.run_id, _ = record.open_run(
            self._identity(), self.out, self.tracking_uri, self.run, resumed_run_id
        )
        params = self.cfg.to_dict()
        params["method_resolved"] = dict(vars(self.method))
        record.log_config(self.run_id, params, self.tracking_uri)
        record.log_resolved_config(self.run_id, self.cfg.to_dict(), self.tracking_uri)

    def _flush_metrics(self) -> None:
        """Send pending ticks to MLflow, skipping any the store already has (idempotent after a kill)."""
        with self.timer.phase("tracking"):
            self._send_pending()

    def _send_pending(self) -> None:
        """MLflow and the metrics table each get the pending ticks they lack (a kill between the two writes
        leaves one behind the other).

        MLflow writes a batch of more than 1000 metrics in several transactions, so each tick's sentinel
        (``SENTINEL_METRIC``, which a resume reads as "this tick is in MLflow") is its last metric: a kill
        between two transactions can then leave a tick half written, sent again whole on the resume, but
        never marked as sent with some of its metrics (a validation) missing.

        Ticks after the one the run resumed from are this attempt's: an earlier attempt that crashed after
        its last checkpoint flushed its own values of them, which MLflow keeps beside these (the newest
        wins, as the report reads it) and the table dropped at the resume (``_drop_table_rows_after``)."""
        if self.run_id:
            logged = self._last_mlflow_step()
            fresh = [(s, m) for s, m in self.pending if s > logged or s > self._resumed_from]
            if fresh:
                logger = tracking.MetricLogger(self.run_id, self.tracking_uri, flush_every=10**9)
                for step, metrics in fresh:
                    last = {SENTINEL_METRIC: metrics[SENTINEL_METRIC]} if SENTINEL_METRIC in metrics else {}
                    logger.log(step, {k: v for k, v in metrics.items() if k != SENTINEL_METRIC} | last)
                logger.flush()
        tabled = self._last_table_step()
        self._append_metrics_table([(s, m) for s, m in self.pending if s > tabled])
        self.pending = []

    def _last_mlflow_step(self) -> int:
        """The newest tick the MLflow run has; -1 for none."""
        history = tracking.client(self.tracking_uri).get_metric_history(self.run_id, SENTINEL_METRIC)
        return max((m.step for m in history), default=-1)

    def _last_table_step(self) -> int:
        """The newest tick in the metrics table (``metrics.jsonl``); -1 for none.

        A last line without its newline was cut off by a kill mid-append: it is cut from the file (its
        tick is appended again from the pending ticks the checkpoint holds) instead of failing every resume.
        """
        return max((step for step, _ in self._table_rows()), default=-1)

    def _table_rows(self) -> list[tuple[int, str]]:
        """``(step, line)`` of each complete line of the metrics table (a torn last line cut from the file,
        as ``_last_table_step`` says); none without a table."""
        table = self.out / "metrics.jsonl"
        if not table.is_file():
            return []
        data = table.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            os.truncate(table, complete)
        lines = [line for line in data[:complete].decode().splitlines() if line.strip()]
        return [(json.loads(line)["step"], line) for line in lines]

    def _drop_table_rows_after(self, tick: int) -> None:
        """Cut the metrics table's rows past ``tick``, the checkpoint a run resumes from: an attempt that
        crashed after it wrote them from a trajectory this one retrains (not the same one on another CPU,
        thread count or sampler)."""
        rows = self._table_rows()
        if any(step > tick for step, _ in rows):
            kept = (line + "\n" for step, line in rows if step <= tick)
            write_lines_atomic(self.out / "metrics.jsonl", kept)

    def _append_metrics_table(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        if not rows:
            return
        path = self.out / "metrics.jsonl"
        with open(path, "a") as fh:
            for step, metrics in rows:
                fh.write(json.dumps({"step": step, **metrics}) + "\n")

    # ------------------------------------------------------------------ state
    def _state(self, tick: int) -> dict[str, Any]:
        return {
            "tick": tick,
            "run_config": self.run_config,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "controller": self.ctrl.state_dict(),
            "monitor": self.monitor.state_dict(),
            "weight_history": self.weights.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "pending": self.pending,
            "val_acc": self.val_acc,
            "run_id": self.run_id,
        }

    def _restore(self, state: dict[str, Any]) -> int:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.ctrl.load_state_dict(state["controller"])
        self.monitor.load_state_dict(state["monitor"])
        if "weight_history" in state:
            self.weights.load_state_dict(state["weight_history"])
        torch.set_rng_state(state["torch_rng"])
        self.pending = list(state["pending"])
        self.val_acc = dict(state["val_acc"])
        return int(state["tick"])

    def _checkpoint(self, tick: int) -> None:
        with self.timer.phase("checkpoint"):
            self.store.save(tick, self._state(tick))
        self._flush_metrics()

    # ------------------------------------------------------------------ one tick
    def _sync_sampler(self, version: int) -> None:
        """Give the sampler weight version ``version`` (the live weights, or one from the history)."""
        if version == self._sampler_version:
            return
        state = self.model.state_dict() if version == self._version else self.weights.get(version)
        self.sampler.push_weights(state)
        self._refresh_sampler_codec()
        self._sampler_version = version

    def _sample(self, tick: int) -> tuple[RolloutBatch, torch.Tensor]:
        cfg = self.cfg
        self._sync_sampler(behaviour_version(tick, cfg.rl.staleness))
        idx = tick_prompt_indices(len(self.train_set), cfg.rl.prompts_per_tick, tick, cfg.seed)
        prompts = [self.train_set.token_ids[i] for i in idx]
        groups = self.sampler.sample(
            prompts,
            cfg.rl.group_size,
            cfg.sampler.temperature,
            cfg.sampler.max_new_tokens,
            seed=cfg.seed * 1_000_003 + tick,
        )
        batch = build_batch(prompts, groups, self.tokenizer.pad_token_id, tick)
        texts = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for g in groups for c in g]
        truths = [self.train_set.ground_truths[idx[k]] for k in batch.prompt_index]
        scores = torch.tensor([boxed_reward(t, gt) for t, gt in zip(texts, truths, strict=True)])
        return batch, scores

    @torch.no_grad()
    def _log_probs(self, model, batch: RolloutBatch, mode: str, start: int = 0) -> torch.Tensor:
        """Log-probs over the batch in fixed micro-batches; rows before ``start`` are left NaN.

        mode: ``compressed`` (through the codec), ``readout`` (through the codec, not counted by the ledger:
        a pass for read-outs only), ``dense`` (uncompressed, counted by the ledger) or ``plain`` (no session
        of the driver's own: the controller's calibration sketch, or an uncounted diagnostic pass).
        """
        model.eval()
        parts = [torch.full((start, batch.response_length), math.nan)]
        for mb_id, mb in micro_batches(batch, self.micro, start):
            pack = mb.pack()
            if mode in ("compressed", "readout"):
                counted = mode == "compressed"
                ctx = self.ctrl.compressed(microbatch_id=mb_id, token_mask=pack.token_mask, counted=counted)
            elif mode == "dense":
                ctx = self.ctrl.dense()
            else:
                ctx = contextlib.nullcontext()
            with ctx:
                parts.append(response_log_probs(model, pack, mb.responses, self.cfg.sampler.temperature))
        return torch.cat(parts)

    def _dense_replay(
        self, batch, adv, ref_dense, metrics_out: dict | None, through_codec: bool = False, corr=None
    ) -> Callable[[], None]:
        """The anchor's replay: forward+backward of the GRPO loss over the whole batch, ratio one; dense (the
        controller sketches it), or ``through_codec`` with micro-batch ``j`` in ``compressed(j)`` as on a
        fast tick (the fire's ``codec_replay``, for ``anchor/grad_cosine_*``: same loss, same weights).
        ``corr``: a decoupled rollout correction of the replay's loss (from the dense old pass)."""
        loss_mask, weights = correction.loss_inputs(corr, batch.response_mask)

        def replay() -> None:
            self.model.train()
            self.optimizer.zero_grad(set_to_none=True)
            grpo.set_global_batch(self.actor_cfg, loss_mask)
            micro: dict[str, list[float]] = {}
            for mb_id, mb in micro_batches(batch, self.micro):
                rows = slice(mb_id * self.micro, mb_id * self.micro + mb.size)
                pack = mb.pack()
                session = (
                    self.ctrl.compressed(microbatch_id=mb_id, token_mask=pack.token_mask)
                    if through_codec
                    else contextlib.nullcontext()
                )
                with session:
                    lp = response_log_probs(self.model, pack, mb.responses, self.cfg.sampler.temperature)
                    loss, m = grpo.grpo_loss(
                        self.actor_cfg,
                        lp,
                        lp.detach(),
                        ref_dense[rows],
                        adv[rows],
                        loss_mask[rows],
                        None if weights is None else weights[rows],
                        eligible_mask=None if metrics_out is None else mb.response_mask,
                    )
                    check_finite(float(loss.detach()), self._step)
                    loss.backward()
                for k, v in m.items():
                    micro.setdefault(k, []).append(v)
            if metrics_out is not None:
                acc: dict[str, list[float]] = {}
                grpo.add_mini_batch(acc, micro)
                metrics_out.update(_mean_metrics(acc))

        return replay

    def _fast_update(self, batch, adv, old, ref, fill_first: bool = False, corr=None) -> dict[str, float]:
        """One optimizer step per mini-batch through the codec. ``fill_first``: ``old`` has no rows for the
        first mini-batch yet; its training forward (same weights, codec and randomness) provides them.
        ``old`` is the clipped objective's behaviour log-probs (the sampler's in bypass mode); ``corr``: a
        decoupled rollout correction (verl's IS weights and rejection mask)."""
        acc: dict[str, list[float]] = {}
        loss_mask, weights = correction.loss_inputs(corr, batch.response_mask)
        self.model.train()
        for start in range(0, batch.size, self.per_mini):
            stop = start + self.per_mini
            self.optimizer.zero_grad(set_to_none=True)
            grpo.set_global_batch(self.actor_cfg, loss_mask[start:stop])
            micro: dict[str, list[float]] = {}
            for mb_id, mb in micro_batches(batch, self.micro, start, stop):
                rows = slice(mb_id * self.micro, mb_id * self.micro + mb.size)
                pack = mb.pack()
                with self.ctrl.compressed(microbatch_id=mb_id, token_mask=pack.token_mask):
                    lp = response_log_probs(self.model, pack, mb.responses, self.cfg.sampler.temperature)
                    if fill_first and start == 0:
                        old[rows] = lp.detach()
                    loss, m = grpo.grpo_loss(
                        self.actor_cfg,
                        lp,
                        old[rows],
                        ref[rows],
                        adv[rows],
                        loss_mask[rows],
                        None if weights is None else weights[rows],
                        eligible_mask=mb.response_mask,
                    )
                    check_finite(float(loss.detach()), self._step)
                    loss.backward()
                for k, v in m.items():
                    micro.setdefault(k, []).append(v)
            grpo.add_mini_batch(acc, micro)
            self.ctrl.compress_gradients()
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.rl.grad_clip)
            acc.setdefault("actor/grad_norm", []).append(float(norm))
            if self.ctrl.is_update_tick():  # method.fast_step=false: no optimizer step between fires
                self.optimizer.step()
        return _mean_metrics(acc)

    def _tick(self, tick: int) -> dict[str, float]:
        cfg = self.cfg
        t0 = time.perf_counter()
        batch, scores = self._sample(tick)
        t_sample = time.perf_counter() - t0
        adv = grpo.grpo_advantages(scores, batch.response_mask, batch.uids, cfg.rl.norm_adv_by_std)
        mask = batch.response_mask
        fire = self.ctrl.is_fire_tick()
        if self.ctrl.is_calibration_tick():  # anchor off, t = 0: Q first, so that every codec pass uses it
            self.ctrl.calibrate(lambda: self._log_probs(self.model, batch, "plain"))
        # On a fast tick the first mini-batch's training forward is the old-log-prob pass itself (same
        # weights, codec and randomness; no dropout), so the old pass skips its rows (verl's on-policy case).
        # A decoupled correction needs every row's old log-prob first; bypass mode needs them for read-outs.
        reuse = not (fire or self.decoupled_correction or self.bypass) and self.forward_is_deterministic
        # In bypass mode the old pass feeds read-outs only (verl's bypass runs none): not counted as traffic.
        old_mode = "readout" if self.bypass else "compressed"
        old = self._log_probs(self.model, batch, old_mode, start=self.per_mini if reuse else 0)
        ref_mode = "compressed" if self.method.kl_ref_forward == "codec" else "dense"
        ref = self._log_probs(self.ref, batch, ref_mode)
        metrics: dict[str, float] = {
            "score/mean": float(scores.mean()),
            "response_length/mean": float(mask.sum(-1).mean()),
            "anchor/fire": float(fire),
        }
        # The dense reference: the anchor's replay needs it; the true-weight KL read-out (sampler policy
        # against the dense base) is logged where it costs no extra pass, and at every validation tick.
        actor = self.actor_cfg
        ref_dense = None
        if ref_mode == "dense" or self.method.codec == "identity":
            ref_dense = ref
        elif self.method.dense_reference_due(tick) or (tick + 1) % cfg.rl.val_every == 0:
            ref_dense = self._log_probs(self.ref, batch, "plain")
        if ref_dense is not None and self.sampler_codec is None:
            metrics["policy/kl_true_weights"] = float(
                grpo.batch_kl(
                    actor.kl_loss_type, actor.loss_agg_mode, batch.sampler_log_probs, ref_dense, mask.bool()
                )
            )
        # A decoupled correction (verl's IS weights and rejection mask) from the trainer's old pass.
        corr = None
        if self.decoupled_correction:
            corr = correction.correct(old, batch.sampler_log_probs, mask, self.correction)
            metrics.update(corr.metrics)
        behaviour = batch.sampler_log_probs if self.bypass else old
        if fire:
            # The anchor's update is dense: in decoupled mode its behaviour-vs-old ratio is the dense
            # policy's, pi_old_dense / pi_sampler (one dense pass, counted), not the compressed one's.
            anchor_corr = None
            if self.decoupled_correction:
                old_dense = self._log_probs(self.model, batch, "dense")
                anchor_corr = correction.correct(old_dense, batch.sampler_log_probs, mask, self.correction)
                metrics.update({f"anchor/{k}": v for k, v in anchor_corr.metrics.items()})
            replay_metrics: dict[str, float] = {}
            self.ctrl.fire(
                self._dense_replay(batch, adv, ref_dense, replay_metrics, corr=anchor_corr),
                self._dense_replay(batch, adv, ref_dense, None, through_codec=True, corr=anchor_corr),
            )
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.rl.grad_clip)
            self.optimizer.step()
            replay_metrics["actor/grad_norm"] = float(norm)
            metrics.update(replay_metrics)
        else:
            metrics.update(self._fast_update(batch, adv, behaviour, ref, fill_first=reuse, corr=corr))
        metrics["actor/kl_loss"] = float(
            grpo.batch_kl(actor.kl_loss_type, actor.loss_agg_mode, old, ref, mask.bool())
        )
        metrics.update(mismatch_metrics(batch.sampler_log_probs, old, mask))
        if corr is None:  # verl's trainer-vs-sampler read-outs (rollout_corr/*), every tick; in bypass mode
            # with a correction also its IS/RS read-outs where the bypass loss starts (pi_theta = old pass)
            metrics.update(correction.correct(old, batch.sampler_log_probs, mask, self.correction).metrics)
        metrics.pop("actor/kl_loss_minibatch", None)
        metrics.update(self.ctrl.end_tick())  # comm/*, and the fire's / calibration's / fast steps' read-outs
        t_train = time.perf_counter() - t0 - t_sample
        self._version = tick + 1
        self.weights.record(self._version, self.model)
        self._sync_sampler(behaviour_version(tick + 1, cfg.rl.staleness))
        metrics["time/sample_s"] = t_sample
        metrics["time/train_s"] = t_train
        metrics["time/step_s"] = time.perf_counter() - t0
        self.timer.add("sample", t_sample)
        self.timer.add("train", t_train)
        self.timer.add("push_weights", metrics["time/step_s"] - t_sample - t_train)
        return metrics

    def _refresh_sampler_codec(self) -> None:
        if self.sampler_codec is not None:
            self.sampler_codec.update(self.ctrl.sampler_codec_fn())

    # ------------------------------------------------------------------ validation
    def _validate(self, step: int) -> dict[str, float]:
        """``val/acc``: greedy accuracy of the live weights, as every condition reads them (the sampler's
        codec off: at tick 0 the base model). With ``sampler.codec: same`` also ``val/acc_sampler_codec``,
        the same through the sampler's codec (the policy this condition samples from; at tick 0 with the
        bases the first fire has not yet calibrated)."""
        with self.timer.phase("validate"):
            self._sync_sampler(self._version)  # validation reads the live policy, whatever the staleness
            out = {}
            if self.sampler_codec is None:
                out["val/acc"] = self._greedy_accuracy()
            else:
                out["val/acc_sampler_codec"] = self._greedy_accuracy()
                with self.sampler_codec.off():
                    out["val/acc"] = self._greedy_accuracy()
        self.val_acc[step] = out["val/acc"]
        return out

    def _greedy_accuracy(self) -> float:
        prompts = self.val_set.token_ids
        outs = self.sampler.greedy(prompts, self.cfg.sampler.max_new_tokens)
        texts = self.tokenizer.batch_decode(outs, skip_special_tokens=True)
        return float(
            np.mean([boxed_reward(t, gt) for t, gt in zip(texts, self.val_set.ground_truths, strict=True)])
        )

    # ------------------------------------------------------------------ main loop
    def train(self) -> RunSummary:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        latest = self.store.load_latest()
        if latest is not None:  # before any model loads: a resume under another config is refused
            fingerprint.check_resume(latest[1].get("run_config"), self.run_config, latest[0], [self.out])
        self._setup()
        start = 0
        resumed_run = None
        if latest is not None:
            start = self._restore(latest[1])
            resumed_run = latest[1].get("run_id")
            read_dir = self.out / read_point_dir_name(start)
            if start == cfg.rl.read_at < cfg.rl.ticks and not read_dir.exists():
                # a finished run extended past its read point: its model at the read tick is the one
                # restored (the loop below exports it only on reaching the read tick)
                with self.timer.phase("checkpoint"):
                    self._save_hf(read_dir)
        self._version, self._resumed_from = start, start
        self._drop_table_rows_after(start)
        if start == 0:
            self.weights.record(0, self.model)
        with self.timer.phase("tracking"):
            self._start_tracking(resumed_run)
        stopped: str | None = None
        status = "FINISHED"
        ticks = cfg.rl.ticks
        bar = tqdm(
            total=ticks,
            initial=start,
            desc=f"{cfg.pair}/{cfg.condition}/seed{cfg.seed}",
            unit="tick",
            disable=os.environ.get("COMMRL_NO_PROGRESS") == "1",
        )
        tick = start
        try:
            self._sync_sampler(self._version)
            if start == 0 and 0 not in self.val_acc:
                val = self._validate(0)
                self.pending.append((0, val))
                self.callbacks.on_validation(0, val["val/acc"])
            for tick in range(start, ticks):
                self._step = tick + 1
                metrics = self._tick(tick)
                reasons = self.monitor.update(metrics)
                metrics["health/alarm"] = float(bool(reasons))
                step = tick + 1
                if step % cfg.rl.val_every == 0 or step == ticks:
                    metrics.update(self._validate(step))
                self.pending.append((step, metrics))
                bar.update(1)
                bar.set_postfix(
                    score=f"{metrics['score/mean']:.3f}",
                    kl=f"{metrics['actor/kl_loss']:.3g}",
                    val=f"{self.val_acc.get(max(self.val_acc), math.nan):.3f}",
                )
                self.callbacks.on_tick(step, metrics)
                if "val/acc" in metrics:
                    self.callbacks.on_validation(step, metrics["val/acc"])
                if reasons and cfg.health.stop_on_alarm:
                    raise StopTraining("collapse alarm: " + "; ".join(reasons))
                if step == cfg.rl.read_at and step < ticks:
                    with self.timer.phase("checkpoint"):
                        self._save_hf(self.out / read_point_dir_name(step))
                preempted = preempt.requested() and step < ticks
                if step % cfg.checkpoint.every == 0 or step == ticks or preempted:
                    self._checkpoint(step)
                tick = step
                if preempted:
                    raise preempt.Preempted(step, preempt.received())
        except preempt.Preempted as stop:  # checkpointed: no final model, no summary; a rerun resumes
            if self.run_id:
                record.mark_preempted(self.run_id, stop.tick, stop.signal_name, self.tracking_uri)
            raise
        except StopTraining as stop:
            stopped = str(stop)
            self._checkpoint(self._step)
            tick = self._step
        except BaseException as err:  # a non-finite loss, another error, Ctrl-C: never left RUNNING
            self._flush_metrics()
            self._end_on(err)
            raise
        finally:
            bar.close()
            self.sampler.close()
        try:  # a full disk here, too, leaves the MLflow run FAILED, not RUNNING
            if self.pending:  # resumed from the last checkpoint of a run killed before it flushed
                self._flush_metrics()
            with self.timer.phase("checkpoint"):
                final = str(self._save_hf(self.out / FINAL_DIR))
        except BaseException as err:
            self._end_on(err)
            raise
        summary = RunSummary(
            pair=cfg.pair,
            condition=cfg.condition,
            seed=cfg.seed,
            driver="local",
            ticks_asked=ticks,
            ticks_trained=tick,
            mlflow_run_id=self.run_id,
            final=final,
            read_at=cfg.rl.read_at,
            read=read_point(self.out, cfg.rl.read_at, tick, final),
            val_acc=dict(self.val_acc),
            stopped_early=stopped,
        )
        with self.timer.phase("tracking"):
            self._finish_run(status, {"stopped_early": stopped} if stopped else {})
        summary = dataclasses.replace(summary, time_s=self.timer.as_dict())
        summary.write(self.out)
        return summary

    def _save_hf(self, target: Path) -> Path:
        """The live (true) weights and the tokenizer as an HF model directory, written atomically."""
        with staged_dir(target) as stage:
            self.model.save_pretrained(stage)
            self.tokenizer.save_pretrained(stage)
        return target

    def _end_on(self, err: BaseException) -> None:
        """End the MLflow run on ``err``: KILLED for Ctrl-C, else FAILED; the error is its tag ``failure``."""
        failure = str(err) if isinstance(err, NonFiniteLossError) else repr(err)
        self._finish_run("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED", {"failure": failure})

    def _finish_run(self, status: str, tags: dict[str, str]) -> None:
        if not self.run_id:
            return
        if status == "FINISHED":
            client = tracking.client(self.tracking_uri)
            client.log_dict(self.run_id, self.manifest(), "checkpoints/manifest.json")
            table = self.out / "metrics.jsonl"
            if table.is_file():
                client.log_artifact(self.run_id, str(table), "metrics")
        record.finish_run(self.run_id, status, tags, self.tracking_uri)

    def manifest(self) -> dict[str, Any]:
        """What the run wrote: checkpoints kept and the final model's files."""
        final = self.out / FINAL_DIR
        return {
            "checkpoints": [f"checkpoints/tick_{t:06d}" for t in self.store.ticks()],
            "final": sorted(p.name for p in final.iterdir()) if final.is_dir() else [],
        }


def _mean_metrics(acc: dict[str, list[float]]) -> dict[str, float]:
    """Means over the entries (micro-batches; a loss share summed per mini-batch: ``grpo.add_mini_batch``);
    token counts are summed into ``actor/effective_token_frac``."""
    carrying, eligible = acc.pop("actor/effective_tokens", None), acc.pop("actor/eligible_tokens", None)
    out = {k: float(np.mean(v)) for k, v in acc.items()}
    if carrying is not None and eligible is not None:
        out["actor/effective_token_frac"] = float(sum(carrying) / max(1.0, sum(eligible)))
    return out


def train_from_config(
    cfg: TrainConfig, run: RunSpec | None = None, callbacks: TrainCallbacks | None = None
) -> RunSummary:
    return LocalTrainer(cfg, run, callbacks).train()
