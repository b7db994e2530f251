"""After a run: ticks from verl's checkpoint tracker, HF folders by verl's own model merger, summary.json."""

from __future__ import annotations

import json

import torch

from commrl.verl_ext.checkpoint import TRACKER, finish_run, latest_tick


def test_finish_run_exports_final_and_read_point_and_flags_missing_ticks(
    cpu_verl, tiny_model_dir, method, tmp_path
):
    """Real verl FSDP2 checkpoints at ticks 1 and 2 (saved as RayPPOTrainer does); 3 asked, read at 1."""
    from transformers import AutoModelForCausalLM

    method(codec="lowrank", cadence=2)
    worker = cpu_verl.build_worker(
        cpu_verl.actor_rollout_ref_config(tiny_model_dir, strategy="fsdp2"), "actor", "commrl"
    )
    batch = cpu_verl.training_batch(worker)
    checkpoints = tmp_path / "run" / "checkpoints"
    for tick in (1, 2):
        cpu_verl.run_ticks(worker, batch, 1, cpu_verl.BATCH)
        worker.save_checkpoint(str(checkpoints / f"global_step_{tick}" / "actor"), global_step=tick)
        (checkpoints / TRACKER).write_text(str(tick))
    assert latest_tick(checkpoints) == 2

    summary = finish_run(tmp_path / "run", ticks_asked=3, read_at=1, mlflow_run_id="abc")
    assert (summary.ticks_trained, summary.ticks_asked, summary.complete) == (2, 3, False)
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (
        written["ticks_trained"] == 2 and written["complete"] is False and written["mlflow_run_id"] == "abc"
    )
    assert written["read_checkpoint"] == str(tmp_path / "run" / "tick1")
    final = AutoModelForCausalLM.from_pretrained(summary.final)
    trained = cpu_verl.full_params(cpu_verl.engine_of(worker))
    for name, value in final.state_dict().items():
        torch.testing.assert_close(value, trained[name].to(value.dtype), msg=name)
    early = AutoModelForCausalLM.from_pretrained(summary.read_checkpoint)
    assert not torch.equal(early.lm_head.weight, final.lm_head.weight)


def test_no_checkpoint_means_zero_ticks(tmp_path):
    summary = finish_run(tmp_path, ticks_asked=100, read_at=100, mlflow_run_id=None)
    assert (summary.ticks_trained, summary.final, summary.complete) == (0, None, False)
    assert json.loads((tmp_path / "summary.json").read_text())["ticks_asked"] == 100
