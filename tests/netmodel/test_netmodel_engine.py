"""Pair A's analytic bytes against verl's engine: the real ``ActorRolloutRefWorker`` on CPU
(``tests/verl_ext/verl_cpu_harness.py``: verl's worker, engine, loss and optimizer, the tiny Qwen2 of hidden
64 with 2 layers, fp32), driven per tick as ``CommrlPPOTrainer`` drives it -- the old-log-prob pass, the
reference pass through the actor's codec (and on a fire tick its uncounted dense twin), one update of the
whole batch or one per mini-batch of two -- counts per tick exactly the bytes ``analytic_inputs`` gives at
the same shapes and tokens: a fire tick (t = 0: with two mini-batches the replay of the first and a dense
update of the second, two dense updates), a fast tick (t = 1) and dense's ticks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from commrl.compression import MethodConfig
from commrl.netmodel.inputs import AnalyticSpec, Compute, Qwen2Shape, analytic_inputs
from commrl.verl_ext.config import METHOD_ENV, method_to_env
from commrl.verl_ext.engine import DENSE_REF_KEY, DENSE_REFERENCE

HARNESS = Path(__file__).resolve().parents[1] / "verl_ext" / "verl_cpu_harness.py"
CONDITIONS = {
    "method": dict(codec="lowrank", grad_codec="powersgd", anchor=True, cadence=2),
    "dense": dict(codec="identity", grad_codec="none", anchor=False, projection="none"),
}
RANK, TICKS = 8, 2


def harness() -> ModuleType:
    """``verl_cpu_harness``, the one ``tests/verl_ext`` imports when it already has (one engine registry)."""
    if "verl_cpu_harness" not in sys.modules:
        spec = importlib.util.spec_from_file_location("verl_cpu_harness", HARNESS)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["verl_cpu_harness"] = module
        spec.loader.exec_module(module)
    return sys.modules["verl_cpu_harness"]


@pytest.fixture(scope="module")
def cpu_verl(tmp_path_factory):
    torch.set_num_threads(1)
    h = harness()
    with h.cpu_world(tmp_path_factory.mktemp("gloo") / "store"):
        yield h, h.build_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


def engine_ticks(
    h: ModuleType, model_dir: Path, method: MethodConfig, updates: int
) -> tuple[int, object, list[dict]]:
    """Real tokens of the batch, the actor's model config, and ``TICKS`` ticks' metrics, ``updates``
    mini-batches (optimizer steps) a tick."""
    cfg = h.actor_rollout_ref_config(model_dir)
    actor, ref = h.build_worker(cfg, "actor", "commrl"), h.build_worker(cfg, "ref", "commrl")
    engine = h.engine_of(actor)
    batch = h.training_batch(actor)
    history = []
    for _ in range(TICKS):
        batch.batch["old_log_probs"] = h.log_probs(actor, batch)
        batch.batch["ref_log_prob"] = h.log_probs(ref, batch, ref=True)
        if method.dense_reference_due(engine.controller.tick):
            batch.batch[DENSE_REF_KEY] = h.log_probs(ref, batch, ref=True, **{DENSE_REFERENCE: True})
        history.append(h.update(actor, batch, h.BATCH // updates))  # one optimizer step per mini-batch
    return int(batch.batch["attention_mask"].sum()), engine.module.config, history


@pytest.mark.parametrize("updates", [1, 2])
@pytest.mark.parametrize("condition", list(CONDITIONS))
def test_the_engine_counts_the_analytic_bytes(cpu_verl, monkeypatch, condition, updates):
    h, model_dir = cpu_verl
    method = MethodConfig(rank=RANK, **CONDITIONS[condition])
    monkeypatch.setenv(METHOD_ENV, method_to_env(method))
    tokens, config, history = engine_ticks(h, model_dir, method, updates)
    shape = Qwen2Shape(
        config.hidden_size,
        config.num_hidden_layers,
        config.intermediate_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.vocab_size,
        config.tie_word_embeddings,
    )
    spec = AnalyticSpec(
        shape,
        tokens,
        RANK,
        method.effective_grad_rank(),
        2,
        act_bytes=4,
        grad_bytes=4,
        updates_per_tick=updates,
        param_bytes=4,
    )
    expected = analytic_inputs(spec, Compute(None), TICKS, stages=1)[condition]

    def logged(key: str) -> np.ndarray:
        return np.array([m[f"comm/{key}"][0] for m in history])

    basis = logged("bytes_basis_refresh")
    assert np.array_equal(logged("bytes_activations") - basis, expected.activations)
    assert np.array_equal(basis, expected.basis)
    assert np.array_equal(logged("bytes_weights"), expected.weights)
    if condition == "method":  # t = 0 fires: old + reference forwards at r, the dense replay at d each way
        dense_update = 4 * sum(int(np.prod(p)) for p in shape.weight_shapes())
        assert expected.weights[0] == updates * dense_update  # every mini-batch's update dense
        hidden, points = config.hidden_size, config.num_hidden_layers
        assert expected.activations.tolist() == [
            points * tokens * 4 * (2 * RANK + 2 * hidden),
            points * tokens * 4 * 4 * RANK,
        ]
