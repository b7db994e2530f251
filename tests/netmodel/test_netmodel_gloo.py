"""The cost model against a real measurement: two gloo processes on loopback (127.0.0.1, a free port)
exchange tensors of the ledger's sizes through a token-bucket sender that caps the rate at 200 Mbit/s.

Sizes: the analytic ledger (``analytic_tick_bytes``) of the tiny pair's shape (hidden 128, 4 layers, MLP 512,
4 heads, 2 KV heads: ``TinyModelShape`` in ``src/commrl/models/tiny.py``; 259 tokens: 256 bytes + 3
specials), 8192 tokens and two dense updates per tick. Measured: one stage boundary's share of a dense
tick's activations (forward 0 -> 1, then backward 1 -> 0) and the ring all-reduce of the tick's dense
weight updates over the two ranks (reduce-scatter, then all-gather, each step both ways at once). Model:
``activation_time`` of the two training traversals on 2 stages x 1 replica in one micro-batch (one
boundary, forward then backward) and ``weight_time`` of the whole update on 1 stage x 2 replicas, at a link of
200 Mbit/s with the measured small-message latency. The bucket makes each exchange last ~0.2-0.35 s;
the load of a busy machine can only delay a send past its due time, never advance it, so the fastest
of three repeats is compared, within 25% of the model.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RATE_BITS = 200e6  # the token bucket's rate, bits per second
CHUNK = 64 * 1024  # bytes per send
REPEATS = 3
TOLERANCE = 0.25


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _send_limited(flat: torch.Tensor, dst: int, rate: float) -> None:
    """Send ``flat`` (uint8) in chunks, chunk ``i`` not before ``t0 + (bytes up to and with it) / rate``:
    the moment a link of that rate would have delivered it."""
    t0, sent = time.perf_counter(), 0
    for start in range(0, flat.numel(), CHUNK):
        piece = flat[start : start + CHUNK]
        sent += piece.numel()
        delay = t0 + sent / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        dist.send(piece, dst)


def _post_recv(flat: torch.Tensor, src: int) -> list:
    return [dist.irecv(flat[start : start + CHUNK], src) for start in range(0, flat.numel(), CHUNK)]


def _ring_allreduce_limited(x: torch.Tensor, rank: int, rate: float) -> torch.Tensor:
    """Ring all-reduce over two ranks with rate-limited sends: rank r owns half r; reduce-scatter (send the
    other half, add the peer's copy of one's own), then all-gather (send one's reduced half)."""
    peer, half = 1 - rank, x.numel() // 2
    parts = [x[:half].clone(), x[half:].clone()]
    incoming = torch.empty_like(parts[rank])
    works = _post_recv(incoming.view(torch.uint8), peer)
    _send_limited(parts[peer].view(torch.uint8), peer, rate)
    for w in works:
        w.wait()
    parts[rank] += incoming
    works = _post_recv(parts[peer].view(torch.uint8), peer)
    _send_limited(parts[rank].view(torch.uint8), peer, rate)
    for w in works:
        w.wait()
    return torch.cat(parts)


def _worker(rank: int, port: int, out_dir: str, act_bytes: int, weight_bytes: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        rate = RATE_BITS / 8  # bytes per second
        ping, rtts = torch.zeros(1), []
        for _ in range(20):
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(ping, 1)
                dist.recv(ping, 1)
            else:
                dist.recv(ping, 0)
                dist.send(ping, 0)
            rtts.append(time.perf_counter() - t0)
        activations = torch.zeros(act_bytes // 2, dtype=torch.bfloat16).view(torch.uint8)
        p2p = []
        for _ in range(REPEATS):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                _send_limited(activations, 1, rate)  # forward
                for w in _post_recv(activations, 1):  # backward
                    w.wait()
            else:
                for w in _post_recv(activations, 0):
                    w.wait()
                _send_limited(activations, 0, rate)
            p2p.append(time.perf_counter() - t0)
        grads = torch.randn(weight_bytes // 4, generator=torch.Generator().manual_seed(rank))
        expected = grads.clone()
        dist.all_reduce(expected)
        allreduce, worst = [], 0.0
        for _ in range(REPEATS):
            dist.barrier()
            t0 = time.perf_counter()
            reduced = _ring_allreduce_limited(grads, rank, rate)
            allreduce.append(time.perf_counter() - t0)
            worst = max(worst, float((reduced - expected).abs().max()))
        result = {"rtt_s": statistics.median(rtts), "p2p_s": p2p, "allreduce_s": allreduce, "max_err": worst}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ledger_sizes():
    """A dense tick of the tiny shape: one boundary's activations (both ways) and the weight updates."""
    from commrl.compression.ledger import analytic_tick_bytes
    from commrl.netmodel import qwen2_weight_shapes

    shapes = qwen2_weight_shapes(128, 4, 512, 4, 2, 259, True)
    b = analytic_tick_bytes(128, 4, shapes, 8192, rank=6, cadence=2, updates_per_tick=2)
    return b


@pytest.fixture(scope="module")
def measured(ledger_sizes, tmp_path_factory) -> list[dict]:
    points = 4
    act_per_direction = int(ledger_sizes.dense_activations / (2 * points))  # one boundary, one replica
    out = tmp_path_factory.mktemp("gloo")
    method = "fork" if threading.active_count() == 1 else "spawn"
    args = (_free_port(), str(out), act_per_direction, int(ledger_sizes.dense_weights))
    mp.start_processes(_worker, args=args, nprocs=2, join=True, start_method=method)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_point_to_point_and_ring_allreduce_match_the_model(ledger_sizes, measured):
    from commrl.netmodel import Layout, Link
    from commrl.netmodel.cost import activation_time, weight_time

    latency_us = measured[0]["rtt_s"] / 2 * 1e6
    link = Link("loopback token bucket", RATE_BITS / 1e9, latency_us)
    boundary = activation_time(ledger_sizes.dense_activations, 2, Layout(stages=2, dp=1, points=4), link)
    allreduce = weight_time(ledger_sizes.dense_weights, Layout(stages=1, dp=2, points=4), link)
    assert 0.15 < boundary < 0.5 and 0.15 < allreduce < 0.5  # the sizes the docstring promises
    p2p_s = min(measured[0]["p2p_s"])  # rank 0 times forward + backward
    ring_s = max(min(m["allreduce_s"]) for m in measured)
    assert p2p_s == pytest.approx(float(boundary), rel=TOLERANCE), (p2p_s, boundary)
    assert ring_s == pytest.approx(float(allreduce), rel=TOLERANCE), (ring_s, allreduce)
    assert all(m["max_err"] < 1e-5 for m in measured)  # the test's all-reduce is an all-reduce
