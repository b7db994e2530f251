"""Two gloo processes on CPU: row-sharded PowerSGD and the controller on an FSDP2 model equal one process.

One spawn (module fixture) runs both checks, each rank writing what it measured; the tests read it.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commrl.compression import MethodConfig, PowerSGD, TwoCircuitController

WORLD = 2
TICKS = 9
CONFIG = {"rank": 8, "cadence": 2, "projection": "relex", "relex_window": 3, "seed": 3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


READOUTS = ("anchor/grad_cosine_raw", "anchor/grad_cosine_corrected", "codec/energy_captured")


def train(model: torch.nn.Module, cfg: MethodConfig, ticks: int) -> tuple[TwoCircuitController, list[dict]]:
    """The driver loop of anchor.py with a language-model loss (same batch on every rank)."""
    from compression_helpers import batch_for_tick, lm_loss

    ctrl = TwoCircuitController(model, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    log = []
    for tick in range(ticks):
        ids, mask = batch_for_tick(tick)

        def replay(ids=ids, mask=mask):
            opt.zero_grad()
            lm_loss(model, ids, mask).backward()

        def codec_replay(ids=ids, mask=mask):
            opt.zero_grad()
            with ctrl.compressed(0, mask):
                lm_loss(model, ids, mask).backward()

        if ctrl.is_fire_tick():
            ctrl.fire(replay, codec_replay)
        else:
            opt.zero_grad()
            with ctrl.compressed(0, mask):
                lm_loss(model, ids, mask).backward()
            ctrl.compress_gradients()
        opt.step()
        log.append(ctrl.end_tick())
    return ctrl, log


def _powersgd_check(mesh) -> float:
    from test_powersgd import random_grads
    from torch.distributed.tensor import Shard, distribute_tensor

    sharded, unsharded = PowerSGD(rank=4, seed=7), PowerSGD(rank=4, seed=7)
    worst = 0.0
    for step in range(3):
        full = {f"p{i}": g for i, g in enumerate(random_grads(step))}
        dtensors = {n: distribute_tensor(g.clone(), mesh, [Shard(0)]) for n, g in full.items()}
        if sharded.compress_(dtensors) != unsharded.compress_(full):
            raise AssertionError("the ledger must count full shapes on every rank")
        for name, g in full.items():
            worst = max(worst, float((dtensors[name].full_tensor() - g).abs().max()))
    return worst


def _controller_check(mesh) -> dict:
    from compression_helpers import tiny_qwen2
    from torch.distributed.fsdp import fully_shard

    cfg = MethodConfig(**CONFIG)
    model = tiny_qwen2()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    ctrl, log = train(model, cfg, TICKS)
    reference = tiny_qwen2()
    ref_ctrl, ref_log = train(reference, cfg, TICKS)
    readouts = [
        abs(m[key] - r[key])
        for m, r in zip(log, ref_log, strict=True)
        for key in (*READOUTS, "sign_memory/agreement")
        if key in r
    ]
    worst = 0.0
    with torch.no_grad():
        for (name, p), (ref_name, q) in zip(
            model.named_parameters(), reference.named_parameters(), strict=True
        ):
            assert name == ref_name
            worst = max(worst, float((p.full_tensor() - q).abs().max()))
    basis = max(
        float((a - b).abs().max()) for a, b in zip(ctrl.codec.bases, ref_ctrl.codec.bases, strict=True)
    )
    return {
        "param_type": type(next(model.parameters())).__name__,
        "weights_max_abs_diff": worst,
        "bases_max_abs_diff": basis,
        "ratio": ctrl.ledger.cumulative / ctrl.ledger.cumulative_dense,
        "ratio_reference": ref_ctrl.ledger.cumulative / ref_ctrl.ledger.cumulative_dense,
        "readouts": len(readouts),
        "readouts_max_abs_diff": max(readouts),
    }


def _worker(rank: int, port: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        result = {"powersgd_max_abs_diff": _powersgd_check(mesh), **_controller_check(mesh)}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory) -> list[dict]:
    """fork, not spawn: the children inherit the imported torch and transformers (spawn re-imports them,
    about ten times slower on a shared 2-core machine). Forking a process with other threads alive (an
    in-process vLLM engine of an earlier test leaves some) can deadlock the children: then spawn."""
    out = tmp_path_factory.mktemp("two_ranks")
    method = "fork" if threading.active_count() == 1 else "spawn"
    mp.start_processes(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True, start_method=method)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


def test_row_sharded_powersgd_equals_unsharded(two_rank_results):
    """DTensor Shard(0) gradients (41 rows -> 21 + 20): three steps with warm start and error feedback
    give the unsharded result row for row."""
    for result in two_rank_results:
        assert result["powersgd_max_abs_diff"] < 1e-5


def test_controller_on_fsdp2_equals_single_process(two_rank_results):
    """fully_shard'ed tiny Qwen2 (DTensor parameters), same batch on both ranks: nine ticks of the method
    (relex over 3 snapshots, sketch all-reduce, sharded PowerSGD, sign memory) land on the weights, bases
    and fast-circuit read-outs of the unsharded run."""
    for result in two_rank_results:
        assert result["param_type"] == "DTensor"
        assert result["weights_max_abs_diff"] < 1e-5
        assert result["bases_max_abs_diff"] < 1e-4
        assert result["ratio"] == pytest.approx(result["ratio_reference"], rel=1e-12)
        assert result["readouts"] == 5 * 3 + 4  # 5 fires x 3 read-outs, 4 fast ticks' sign agreement
        assert result["readouts_max_abs_diff"] < 1e-5  # summed over the ranks' shards and tokens
