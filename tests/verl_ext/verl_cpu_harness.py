"""verl 0.9.1's real actor stack on CPU, in-process: what the tests of commrl.verl_ext run against.

- ``cpu_world(store)``: a CPU platform through verl's platform plugin API (``device_name = "cpu"``, gloo), a
  gloo process group, and engine registrations for device ``cpu``, keyed by vendor so that a test picks
  the stock or the commrl engine with ``VERL_ENGINE_VENDOR``:

  ==========  ========================================  ===========================================
  backend     vendor ``stock``                          vendor ``commrl``
  ==========  ========================================  ===========================================
  ``fsdp``    ``CPUPlainEngine`` (no FSDP wrapping)     ``TwoCircuitEngineMixin`` + ``CPUPlainEngine``
  ``fsdp2``   verl's ``FSDPEngineWithLMHead`` (gloo)    ``commrl.verl_ext.TwoCircuitFSDPEngine``
  ==========  ========================================  ===========================================

- ``paper_config``: the paper pair's run config resolved as ``commrl verl-train --dry-run`` resolves it
  (``compose_run`` + ``run_overrides`` + verl's own ``ppo_trainer.yaml``), with only what differs on this
  device overridden (the tiny model, fp32, no torch.compile, the harness's batch shapes);
  ``actor_rollout_ref_config``: its ``actor_rollout_ref`` with the engine tests' shapes
  (``engine_test_shapes``: strategy, padded layout, several micro-batches per mini-batch).
- ``build_worker``: ``verl.workers.engine_workers.ActorRolloutRefWorker`` (role actor or ref), ``init_model``.
- ``make_batch`` / ``log_probs`` / ``update``: the batches and calls ``RayPPOTrainer`` makes.

Only the GPU is replaced (no CUDA here); the worker, the engine, the loss and the optimizer are verl's own.
"""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

DIST_ENV = dict(
    MASTER_ADDR="127.0.0.1",
    MASTER_PORT="29533",
    RANK="0",
    WORLD_SIZE="1",
    LOCAL_RANK="0",
    LOCAL_WORLD_SIZE="1",
    TOKENIZERS_PARALLELISM="false",
)
N_PROMPTS, ROLLOUT_N, PROMPT_LEN, RESP_LEN = 4, 4, 12, 16
BATCH = N_PROMPTS * ROLLOUT_N


def _zero(*args, **kwargs) -> int:
    return 0


def _noop(*args, **kwargs) -> None:
    return None


_CPU_DEVICE_MODULE = SimpleNamespace(
    max_memory_allocated=_zero,
    max_memory_reserved=_zero,
    memory_allocated=_zero,
    memory_reserved=_zero,
    reset_peak_memory_stats=_noop,
    empty_cache=_noop,
    synchronize=_noop,
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    is_available=lambda: True,
    device_count=lambda: 1,
    current_device=lambda: "cpu",
    set_device=_noop,
    mem_get_info=lambda *a, **k: (0, 0),
    get_rng_state=torch.get_rng_state,
    set_rng_state=torch.set_rng_state,
    get_device_name=lambda *a, **k: "CPU",
)


def _platform_class():
    from verl.plugin.platform import PlatformBase

    class PlatformCPU(PlatformBase):
        """The host CPU as a verl platform: ``get_device_id()`` is ``"cpu"``, collectives use gloo."""

        device_name = "cpu"
        vendor_name = "stock"
        device_module = _CPU_DEVICE_MODULE

        def is_available(self) -> bool:
            return True

        def current_device(self):
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            pass

        def synchronize(self, device_index=None) -> None:
            pass

        def manual_seed(self, seed) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index=0):
            return (None, None)

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    return PlatformCPU


_registered = False


def install_platform() -> None:
    """Make the host CPU verl's platform (before any engine is built); set the single-process env defaults."""
    for key, value in DIST_ENV.items():
        os.environ.setdefault(key, value)
    from verl.plugin.platform import set_platform

    set_platform(_platform_class()())


def register_engines() -> None:
    """The ``cpu`` engine registrations of the table above; once per process."""
    global _registered
    if _registered:
        return
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from commrl.verl_ext import TwoCircuitEngineMixin, TwoCircuitFSDPEngine

    class CPUPlainEngine(FSDPEngineWithLMHead):
        """verl's FSDP engine minus FSDP: the HF module as it is, fp32, plain ``clip_grad_norm_`` + AdamW."""

        def _build_fsdp_module(self, module):
            self._autocast_dtype = torch.float32
            self.scaler = None
            return module

    class CPUTwoCircuitEngine(TwoCircuitEngineMixin, CPUPlainEngine):
        """The commrl mixin on the plain CPU engine."""

    register = EngineRegistry.register
    register(model_type="language_model", backend="fsdp", device="cpu", vendor="stock")(CPUPlainEngine)
    register(model_type="language_model", backend="fsdp", device="cpu", vendor="commrl")(CPUTwoCircuitEngine)
    register(model_type="language_model", backend="fsdp2", device="cpu", vendor="stock")(FSDPEngineWithLMHead)
    register(model_type="language_model", backend="fsdp2", device="cpu", vendor="commrl")(
        TwoCircuitFSDPEngine
    )
    _registered = True


@contextmanager
def cpu_world(store: Path, rank: int = 0, world_size: int = 1):
    """verl on CPU inside a gloo process group (a file store: no port to collide on); restores the platform
    and the distributed environment variables after (a RANK or WORLD_SIZE left behind makes a later
    process, e.g. accelerate in lm-eval's HF backend, start a process group of its own)."""
    from verl.plugin.platform import get_platform, set_platform

    previous = get_platform()
    saved_env = {key: os.environ.get(key) for key in DIST_ENV}  # install_platform sets their defaults
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    install_platform()
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size
    )
    register_engines()
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        set_platform(previous)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def build_tiny_model_dir(out: Path) -> Path:
    """commrl's tiny Qwen2 at hidden 64 (2 heads of 32), 2 layers: small enough for seconds per update."""
    from commrl.models.tiny import TinyModelShape, build_char_tokenizer, build_tiny_model, save_model_dir

    shape = TinyModelShape(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        num_hidden_layers=2,
    )
    tok = build_char_tokenizer()
    return save_model_dir(build_tiny_model(shape, tok, seed=0), tok, out)


# What differs on this device from the GPU recipe: the model, fp32 for bf16, no torch.compile, and the
# reference on the plain CPU engine (verl's FSDP2 reference offloads to pinned memory, which needs an
# accelerator). Batch shapes follow the harness's batch (N_PROMPTS prompts x ROLLOUT_N samples); the LR
# schedule's length is what RayPPOTrainer sets from trainer.total_training_steps before it builds workers.
def cpu_overrides(model_dir: Path) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
        "actor_rollout_ref.ref.fsdp_config.model_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.ref.strategy=fsdp",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={N_PROMPTS // 2}",
        f"actor_rollout_ref.rollout.n={ROLLOUT_N}",
        "actor_rollout_ref.actor.optim.total_training_steps=20",
    ]


def paper_config(model_dir: Path, pair: str = "A", condition: str = "method", extra: tuple[str, ...] = ()):
    """verl's whole config of the paper run (pair, condition, seed 0), as ``commrl verl-train --dry-run``
    resolves it, on the tiny model and this device (``cpu_overrides``), then ``extra``."""
    import tempfile

    from commrl.verl_ext.config import compose_run, compose_verl_config, run_overrides

    run = compose_run(pair, condition, 0)
    where = Path(tempfile.gettempdir()) / "commrl-harness"  # paths only: nothing is read or written there
    overrides = run_overrides(run, where / "run", where / "data", tracking_uri=f"sqlite:///{where}/mlflow.db")
    return compose_verl_config([*overrides, *cpu_overrides(model_dir), *extra])


def engine_test_shapes(strategy: str = "fsdp") -> tuple[str, ...]:
    """The engine tests' shapes: ``strategy`` (``fsdp``: the plain CPU engine), padded inputs, no gradient
    checkpointing, 4-row micro-batches (several PRF keys per pass), a learning rate that moves the tiny
    model."""
    return (
        f"actor_rollout_ref.actor.strategy={strategy}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.use_dynamic_bsz=False",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-3",
    )


def actor_rollout_ref_config(model_dir: Path, strategy: str = "fsdp", extra: tuple[str, ...] = ()):
    """``actor_rollout_ref`` of ``paper_config`` with ``engine_test_shapes(strategy)``, then ``extra``."""
    return paper_config(model_dir, extra=(*engine_test_shapes(strategy), *extra)).actor_rollout_ref


def build_worker(cfg, role: str, vendor: str):
    """``ActorRolloutRefWorker(role)`` with the engine of ``vendor`` (``stock`` | ``commrl``), initialised."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    os.environ["VERL_ENGINE_VENDOR"] = vendor
    try:
        worker = ActorRolloutRefWorker(config=copy.deepcopy(cfg), role=role)
        worker.init_model()
    finally:
        os.environ.pop("VERL_ENGINE_VENDOR", None)
    return worker


def engine_of(worker):
    return (worker.actor or worker.ref).engine


def make_batch(vocab_size: int, pad_id: int, seed: int = 0, rows: slice | None = None):
    """A rollout-shaped ``DataProto``: left-padded prompts, right-padded responses, groups of n."""
    from verl import DataProto

    g = torch.Generator().manual_seed(seed)
    prompts = torch.full((BATCH, PROMPT_LEN), pad_id, dtype=torch.long)
    responses = torch.full((BATCH, RESP_LEN), pad_id, dtype=torch.long)
    attn = torch.zeros(BATCH, PROMPT_LEN + RESP_LEN, dtype=torch.long)
    for i in range(BATCH):
        pl = int(torch.randint(4, PROMPT_LEN + 1, (1,), generator=g))
        rl = int(torch.randint(3, RESP_LEN + 1, (1,), generator=g))
        prompts[i, PROMPT_LEN - pl :] = torch.randint(3, vocab_size, (pl,), generator=g)
        responses[i, :rl] = torch.randint(3, vocab_size, (rl,), generator=g)
        attn[i, PROMPT_LEN - pl : PROMPT_LEN + rl] = 1
    scores = torch.randint(0, 2, (BATCH,), generator=g).float()
    batch = DataProto.from_dict(
        tensors=dict(
            prompts=prompts,
            responses=responses,
            input_ids=torch.cat([prompts, responses], dim=1),
            attention_mask=attn,
            position_ids=torch.clamp(torch.cumsum(attn, dim=-1) - 1, min=0),
            response_mask=attn[:, PROMPT_LEN:],
            scores=scores,
        ),
        non_tensors=dict(
            uid=np.repeat(np.array([f"p{i}" for i in range(N_PROMPTS)], dtype=object), ROLLOUT_N)
        ),
        meta_info=dict(temperature=1.0),
    )
    return batch if rows is None else batch[rows]


def _to_td(batch, **non_tensor):
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(td, **non_tensor)
    return td


def log_probs(worker, batch, ref: bool = False, **flags) -> torch.Tensor:
    """(batch, response) log-probs of ``compute_log_prob`` (or ``compute_ref_log_prob``), trainer-padded;
    ``flags``: further non-tensor entries of the request (``engine.DENSE_REFERENCE``)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    td = _to_td(batch, calculate_entropy=False, compute_loss=False, **flags)
    out = worker.compute_ref_log_prob(td) if ref else worker.compute_log_prob(td)
    return no_padding_2_padding(tu.get(out, "log_probs"), td).float()


def add_advantages(batch) -> None:
    """GRPO outcome advantages of the batch's ``scores`` (verl's ``compute_grpo_outcome_advantage``)."""
    from verl.trainer.ppo import core_algos

    mask = batch.batch["response_mask"]
    rewards = torch.zeros(mask.shape, dtype=torch.float32)
    rewards[torch.arange(mask.shape[0]), mask.sum(-1) - 1] = batch.batch["scores"]
    adv, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=rewards, response_mask=mask, index=batch.non_tensor_batch["uid"]
    )
    batch.batch["advantages"] = adv


def update(worker, batch, mini_batch_size: int) -> dict:
    """One trainer step: ``update_actor`` on the batch (``mini_batch_size`` rows per optimizer step)."""
    from verl.utils import tensordict_utils as tu

    td = _to_td(
        batch,
        calculate_entropy=False,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=mini_batch_size,
        mini_batch_size=mini_batch_size,
        epochs=1,
        seed=42,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
        temperature=1.0,
    )
    return dict(tu.get(worker.update_actor(td), "metrics"))


def full_params(engine) -> dict[str, torch.Tensor]:
    """The engine's parameters as full tensors (``DTensor`` shards gathered)."""
    out = {}
    for name, p in engine.module.named_parameters():
        t = p.detach()
        out[name] = (t.full_tensor() if hasattr(t, "full_tensor") else t).clone()
    return out


def training_batch(worker, seed: int = 0):
    """The full rollout batch with GRPO advantages and a fixed reference log-prob (-2 per token), through
    the codec and dense (``DENSE_REF_KEY``, which the trainer adds on fire ticks)."""
    from commrl.verl_ext.engine import DENSE_REF_KEY

    engine = engine_of(worker)
    batch = make_batch(
        engine.module.config.vocab_size, worker.actor.model_config.tokenizer.pad_token_id, seed
    )
    add_advantages(batch)
    batch.batch["ref_log_prob"] = torch.full(batch.batch["response_mask"].shape, -2.0)
    batch.batch[DENSE_REF_KEY] = batch.batch["ref_log_prob"].clone()
    return batch


def run_ticks(worker, batch, ticks: int, mini_batch_size: int) -> list[dict]:
    """``ticks`` trainer steps on one batch as the trainer runs them: old log-probs, then ``update_actor``."""
    history = []
    for _ in range(ticks):
        batch.batch["old_log_probs"] = log_probs(worker, batch)
        history.append(update(worker, batch, mini_batch_size))
    return history


def unsharded_fsdp_modules(module) -> list[str]:
    """Names of the FSDP2 modules whose parameter groups are gathered now ("" = the root)."""
    from torch.distributed.fsdp import FSDPModule

    names = []
    for name, sub in module.named_modules():
        if not isinstance(sub, FSDPModule):
            continue
        state = sub._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)  # torch >= 2.12; a single group before
        if groups is None:
            groups = [g] if (g := getattr(state, "_fsdp_param_group", None)) is not None else []
        if any(group.is_unsharded for group in groups):
            names.append(name)
    return names


def sharded_run(
    rank: int,
    world_size: int,
    store: str,
    model_dir: str,
    method_json: str,
    ticks: int,
    out: str,
    extra: tuple[str, ...] = (),
):
    """One rank of a ``world_size``-rank FSDP2 run of the commrl engine on its slice of the batch.

    Rank 0 saves the gathered parameters and its metric history to ``out`` (a ``multiprocessing`` target).
    """
    from commrl.verl_ext.config import METHOD_ENV

    os.environ[METHOD_ENV] = method_json
    torch.set_num_threads(1)
    with cpu_world(Path(store), rank, world_size):
        cfg = actor_rollout_ref_config(Path(model_dir), strategy="fsdp2", extra=extra)
        worker = build_worker(cfg, "actor", "commrl")
        rows = BATCH // world_size
        batch = training_batch(worker)[rank * rows : (rank + 1) * rows]
        history = run_ticks(worker, batch, ticks, BATCH)
        params = full_params(engine_of(worker))
    if rank == 0:
        torch.save({"params": params, "history": history}, out)
