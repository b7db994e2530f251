#!/usr/bin/env python
"""Engine-level check of commrl.verl_ext on one CUDA GPU: verl's real workers, no vLLM, no Ray.

    python scripts/gpu_engine_check.py                 # from the repository root, in the GPU environment
    python scripts/gpu_engine_check.py --work /tmp/x   # keep the tiny model and checkpoints in /tmp/x

It builds verl 0.9.1's ``ActorRolloutRefWorker`` in this process (roles ``actor`` and ``ref``, one NCCL rank)
from pair A's run config as ``commrl verl-train --dry-run`` resolves it -- so with the recipe's engine
settings: FSDP2, bf16 mixed precision, packed inputs (``use_remove_padding``) under sdpa, dynamic
micro-batches, gradient checkpointing -- on a tiny Qwen2 (hidden 256, 4 layers), overriding only the model,
the batch shapes (several micro-batches per pass), the learning rate and the anchor cadence (K = h = 2). It
checks:

1. the registry gives ``TwoCircuitFSDPEngine`` on (cuda, nvidia) and verl's engine with
   ``VERL_ENGINE_VENDOR=stock``; the configured attention (sdpa) is the one in use;
2. the dense condition equals the stock engine: log-probs, reference log-probs, the weight updates of 3
   ticks (AdamW), ``comm/ratio_vs_dense = 1``;
3. the method (pair A's), 5 ticks: ``anchor/fire = [1, 0, 1, 0, 1]``, fewer bytes than dense on tick 1, every
   FSDP2 group resharded after each old-log-prob pass, the replay seeing the stale view (tick 2: theta_0) and
   the secant projection (tick 4: 2 theta_2 - theta_0), the live weights back after a fire, and
   ``get_per_tensor_param()`` (what vLLM receives) equal to the live weights;
4. a checkpoint round trip: the controller's tick and the weights restored, the next tick identical.

Exit status: 0 when every check passes, 1 when one fails, 2 without a CUDA GPU. The batch and call helpers
are the CPU tests' (tests/verl_ext/verl_cpu_harness.py), without its CPU platform.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXIT_FAILED, EXIT_NO_GPU = 1, 2
METHOD_TICKS = 5  # K = h = 2: fires at 0, 2, 4; tick 2 replays theta_0, tick 4 the secant 2 theta_2 - theta_0
PROBE = "model.layers.0.self_attn.q_proj"  # the Linear whose gathered weight the replay is read from
METHOD_OVERRIDES = ("method.cadence=2", "method.delay=2")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu_engine_check.py",
        description="commrl's two-circuit engine inside verl's real workers on one CUDA GPU (see the "
        "module docstring for the checks)",
    )
    parser.add_argument("--work", type=Path, default=None, help="folder for the tiny model and checkpoints")
    parser.add_argument(
        "--max-token-len",
        type=int,
        default=128,
        help="actor_rollout_ref.actor.ppo_max_token_len_per_gpu: the dynamic micro-batch budget (default "
        "128: 3-4 micro-batches of the 16-row batch)",
    )
    return parser.parse_args(argv)


class Checks:
    """PASS/FAIL lines, printed as they come; ``failed`` lists what failed."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def __call__(self, ok: bool, what: str) -> bool:
        print(("PASS " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.failed.append(what)
        return ok


def last(metrics: dict, key: str) -> float:
    """The value of one metric of an update (the worker returns lists)."""
    value = metrics[key]
    while isinstance(value, list):
        value = value[-1]
    return float(value)


def sq_dist(a: dict, b: dict) -> float:
    return sum(float((a[n].float() - b[n].float()).square().sum()) for n in a)


class ReplayProbe:
    """The weight of one Linear as the anchor's dense replay sees it (FSDP2's gathered parameter), by tick."""

    def __init__(self, engine, name: str) -> None:
        self.engine, self.seen = engine, {}
        engine.module.get_submodule(name).register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        if self.engine._pass == "replay":
            weight = module.weight.detach()
            weight = weight.full_tensor() if hasattr(weight, "full_tensor") else weight
            self.seen.setdefault(self.engine.controller.tick, weight.float().cpu().clone())


def replay_view_check(check: Checks, seen, expected, live, what: str) -> None:
    """The replay's weight is ``expected`` (in the replay's dtype), not the live one."""
    import torch

    dtype = torch.bfloat16 if seen.dtype == torch.bfloat16 else seen.dtype
    err = float((seen - expected.to(dtype).float()).norm())
    off = float((seen - live.to(dtype).float()).norm())
    check(err < 0.1 * off, f"{what}: |seen - view| {err:.3e} < 0.1 |seen - live| {off:.3e}")


def run_checks(config_for: Callable[[str], object], vendor: str, work: Path, check: Checks, H) -> None:
    """Checks 1-4 (module docstring) with workers of ``vendor`` (the commrl engine's) and ``stock``;
    ``config_for(condition)`` sets ``COMMRL_METHOD`` and returns the ``actor_rollout_ref`` config; ``H`` is
    verl_cpu_harness."""
    import torch

    # 1 + 2. dense == stock (the reference built first, as the fused worker builds it)
    cfg = config_for("dense")
    stock_ref, stock = (H.build_worker(cfg, role, "stock") for role in ("ref", "actor"))
    our_ref, ours = (H.build_worker(cfg, role, vendor) for role in ("ref", "actor"))
    check(type(H.engine_of(stock)).__name__ == "FSDPEngineWithLMHead", "vendor stock: verl's engine")
    check(type(H.engine_of(ours)).__name__ == "TwoCircuitFSDPEngine", f"vendor {vendor}: the commrl engine")
    attn = {H.engine_of(w).module.config._attn_implementation for w in (stock_ref, stock, our_ref, ours)}
    check(attn == {cfg.model.override_config.attn_implementation}, f"attention in use {attn} == configured")
    batch = H.training_batch(stock)
    d_lp = float((H.log_probs(ours, batch).cpu() - H.log_probs(stock, batch).cpu()).abs().max())
    d_ref = float(
        (H.log_probs(our_ref, batch, ref=True).cpu() - H.log_probs(stock_ref, batch, ref=True).cpu())
        .abs()
        .max()
    )
    check(d_lp < 1e-3 and d_ref < 1e-3, f"dense log-probs == stock (max diff {d_lp:.2e}, ref {d_ref:.2e})")
    start = H.full_params(H.engine_of(stock))
    hist_stock = H.run_ticks(stock, copy.deepcopy(batch), 3, H.BATCH)
    hist_ours = H.run_ticks(ours, copy.deepcopy(batch), 3, H.BATCH)
    ps, po = H.full_params(H.engine_of(stock)), H.full_params(H.engine_of(ours))
    rel = (sq_dist(po, ps) / sq_dist(ps, start)) ** 0.5  # AdamW turns float noise at ~0 grads into steps
    check(rel < 1e-2, f"dense weight updates of 3 ticks == stock (relative diff {rel:.2e})")
    ratios = [last(m, "comm/ratio_vs_dense") for m in hist_ours]
    check(ratios == [1.0, 1.0, 1.0] and "comm/bytes_total" not in hist_stock[0], f"dense ratio {ratios}")
    del stock, stock_ref, ours, our_ref
    torch.cuda.empty_cache()

    # 3. the method
    cfg = config_for("method")
    actor = H.build_worker(cfg, "actor", vendor)
    engine = H.engine_of(actor)
    probe = ReplayProbe(engine, PROBE)
    batch = H.training_batch(actor)
    thetas, history = [], []
    for tick in range(METHOD_TICKS):
        thetas.append(H.full_params(engine))
        batch.batch["old_log_probs"] = H.log_probs(actor, batch)
        gathered = H.unsharded_fsdp_modules(engine.module)
        check(
            not gathered,
            f"tick {tick}: every FSDP2 group resharded after the old-log-prob pass {gathered[:3]}",
        )
        history.append(H.update(actor, batch, H.BATCH))
    thetas.append(H.full_params(engine))
    fires = [last(m, "anchor/fire") for m in history]
    check(fires == [1.0, 0.0, 1.0, 0.0, 1.0], f"anchor/fire {fires} == [1, 0, 1, 0, 1]")
    ratio = last(history[1], "comm/ratio_vs_dense")
    check(ratio < 1.0, f"tick 1 comm/ratio_vs_dense {ratio:.3f} < 1")
    weight = f"{PROBE}.weight"
    replay_view_check(
        check, probe.seen[2], thetas[0][weight], thetas[2][weight], "tick 2 replay sees theta_0"
    )
    secant = 2 * thetas[2][weight] - thetas[0][weight]
    replay_view_check(
        check, probe.seen[4], secant, thetas[4][weight], "tick 4 replay sees 2 theta_2 - theta_0"
    )
    check(  # one step from theta_2 against three from the replay's view theta_0
        sq_dist(thetas[3], thetas[2]) < sq_dist(thetas[3], thetas[0]),
        "after the tick-2 fire the weights are the live ones plus the step, not the replay's view",
    )
    sync, _ = engine.get_per_tensor_param()
    sync = {name: t.detach().cpu() for name, t in sync}
    live = H.full_params(engine)
    missing = sorted(set(live) - set(sync))
    check(not missing, f"get_per_tensor_param() names cover the live parameters (missing {missing[:3]})")
    gap = max(float((sync[n].float() - live[n].cpu().to(sync[n].dtype).float()).abs().max()) for n in live)
    check(gap == 0.0, f"get_per_tensor_param() (what vLLM receives) == live weights (max diff {gap:.2e})")

    # 4. checkpoint round trip
    folder = work / "checkpoints" / f"global_step_{METHOD_TICKS}" / "actor"
    actor.save_checkpoint(str(folder), global_step=METHOD_TICKS)
    again = H.build_worker(cfg, "actor", vendor)
    again.load_checkpoint(str(folder))
    check(H.engine_of(again).controller.tick == METHOD_TICKS, f"checkpoint: controller tick {METHOD_TICKS}")
    restored = H.full_params(H.engine_of(again))
    check(all(torch.equal(restored[n], live[n]) for n in live), "checkpoint: weights restored")
    a = H.run_ticks(actor, copy.deepcopy(batch), 1, H.BATCH)[0]
    b = H.run_ticks(again, copy.deepcopy(batch), 1, H.BATCH)[0]
    pa, pb = H.full_params(engine), H.full_params(H.engine_of(again))
    same = (
        all(torch.equal(pa[n], pb[n]) for n in pa)
        and a["comm/bytes_cumulative"] == b["comm/bytes_cumulative"]
    )
    check(same, "checkpoint: the next tick is identical (weights, comm/bytes_cumulative)")


def gpu_config_for(model_dir: Path, work: Path, max_token_len: int, harness) -> Callable[[str], object]:
    """``config_for(condition)``: pair A's resolved config for ``condition`` on the tiny model."""
    from commrl.verl_ext.config import (
        METHOD_ENV,
        compose_run,
        compose_verl_config,
        method_to_env,
        run_overrides,
    )

    def config_for(condition: str):
        run = compose_run("A", condition, 0, METHOD_OVERRIDES)
        os.environ[METHOD_ENV] = method_to_env(run.method)
        overrides = run_overrides(
            run, work / "run", work / "data", tracking_uri=f"sqlite:///{work}/mlflow.db"
        )
        shapes = [
            f"actor_rollout_ref.model.path={model_dir}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={harness.N_PROMPTS}",
            f"actor_rollout_ref.rollout.n={harness.ROLLOUT_N}",
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={max_token_len}",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.actor.optim.total_training_steps=20",
        ]
        return compose_verl_config([*overrides, *shapes]).actor_rollout_ref

    return config_for


def tiny_model(work: Path) -> Path:
    """commrl's tiny Qwen2 at hidden 256 (4 heads of 64, 2 KV heads), 4 layers: rank 77 compresses it."""
    from commrl.models.tiny import TinyModelShape, build_char_tokenizer, build_tiny_model, save_model_dir

    shape = TinyModelShape(
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        num_hidden_layers=4,
    )
    tokenizer = build_char_tokenizer()
    return save_model_dir(build_tiny_model(shape, tokenizer, seed=0), tokenizer, work / "tiny")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_engine_check: needs a CUDA GPU and this machine has none (torch.cuda.is_available() is "
            "False); on CPU the same engine runs in the tests: pytest tests/verl_ext",
            file=sys.stderr,
        )
        return EXIT_NO_GPU
    sys.path[:0] = [str(REPO / "src"), str(REPO / "tests" / "verl_ext")]
    import verl_cpu_harness as harness  # the batches and calls of the CPU tests; its CPU platform stays off

    for key, value in harness.DIST_ENV.items():  # one rank; verl's worker inits the NCCL group itself
        os.environ.setdefault(key, value)
    torch.cuda.set_device(0)
    import commrl.verl_ext  # noqa: F401  (registers the engine for (cuda, nvidia))

    work = args.work or Path(tempfile.mkdtemp(prefix="commrl_gpu_engine_"))
    work.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    check = Checks()
    from verl.workers.engine import EngineRegistry

    resolved = EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__
    check(resolved == "TwoCircuitFSDPEngine", f"registry: (cuda, nvidia) fsdp2 -> {resolved}")
    config_for = gpu_config_for(tiny_model(work), work, args.max_token_len, harness)
    run_checks(config_for, "nvidia", work, check, harness)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    verdict = "all checks passed" if not check.failed else "FAILED: " + "; ".join(check.failed)
    print(f"gpu_engine_check: {verdict} ({time.monotonic() - began:.0f} s; work folder {work})", flush=True)
    return EXIT_FAILED if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
