"""Links and layouts of the network model: named interconnects (each with its source), links of the user's
own, and the pipeline x data-parallel layout onto which the byte ledger's channels are mapped.

Units: bandwidth in Gbit/s (1e9 bit/s) **per direction** of a full-duplex link, the ``beta`` of the
alpha-beta model; latency in microseconds per message, its ``alpha``. Bytes per second are
``bandwidth_gbps * 1e9 / 8``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from commrl.errors import ConfigError

BITS_PER_BYTE = 8
# How the weight update crosses the data-parallel replicas (commrl.netmodel.cost.weight_time):
# - allreduce: DDP. Every update, dense gradients or PowerSGD's factors, is ring all-reduced; parameters are
#   replicated, so none are sent.
# - rs_ag: FSDP / ZeRO-3. Each replica keeps a shard of the parameters: dense gradients are reduce-scattered
#   and the updated parameters all-gathered (dense: the gradient compressor leaves them alone). PowerSGD's
#   factors cannot be reduce-scattered (P = M Q must be summed whole before it is orthogonalised), so a
#   compressed update is ring all-reduced, then the parameters all-gathered.
COLLECTIVES = ("allreduce", "rs_ag")


class NetModelError(ConfigError):
    """A bad network-model parameter; ``field`` names it (``commrl netmodel`` maps it to the option that sets
    it), the message says what is allowed and the fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def invalid(field: str, value: Any, allowed: str, fix: str) -> NetModelError:
    """``field=value is invalid: allowed; fix``."""
    return NetModelError(field, f"{field}={value!r} is invalid: {allowed}; {fix}")


def finite_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Link:
    """One link: ``bandwidth_gbps`` per direction, ``latency_us`` per message; ``source`` says where the
    numbers come from (a standard, a vendor's data sheet, or ``user``)."""

    name: str
    bandwidth_gbps: float
    latency_us: float
    source: str = "user"

    def __post_init__(self) -> None:
        if not finite_number(self.bandwidth_gbps) or self.bandwidth_gbps <= 0:
            raise invalid(
                "bandwidth_gbps",
                self.bandwidth_gbps,
                f"link {self.name!r} needs a finite bandwidth > 0 Gbit/s (per direction)",
                "give a positive number, e.g. 25 for 25 Gbit/s",
            )
        if not finite_number(self.latency_us) or self.latency_us < 0:
            raise invalid(
                "latency_us",
                self.latency_us,
                f"link {self.name!r} needs a finite latency >= 0 microseconds per message",
                "give a non-negative number, e.g. 5 (0 ignores latency)",
            )

    @property
    def bytes_per_s(self) -> float:
        """``beta`` in bytes per second: ``bandwidth_gbps * 1e9 / 8``."""
        return self.bandwidth_gbps * 1e9 / BITS_PER_BYTE

    @property
    def latency_s(self) -> float:
        """``alpha`` in seconds: ``latency_us * 1e-6``."""
        return self.latency_us * 1e-6


# Bandwidths are the standards' or vendors' per-direction line rates. Latencies are per-message
# small-message latencies; only ConnectX-5's is a vendor figure, the others are typical orders of magnitude
# (kernel TCP on Ethernet; RDMA on InfiniBand; GPU-to-GPU on NVLink), not specifications: measure your own
# (sockperf, ib_write_lat, nccl-tests) and pass it as a custom link.
INTERCONNECTS: dict[str, Link] = {
    "1GbE": Link(
        "1GbE",
        1.0,
        50.0,
        # IEEE 802.3ab-1999 (1000BASE-T): 1 Gbit/s full duplex. Latency: kernel TCP, typical order 50 us.
        "IEEE 802.3ab (1000BASE-T), 1 Gbit/s per direction; latency typical of kernel TCP (not a spec)",
    ),
    "10GbE": Link(
        "10GbE",
        10.0,
        10.0,
        # IEEE 802.3ae-2002: 10 Gbit/s full duplex. Latency: kernel TCP on 10GbE NICs, typical order 10 us.
        "IEEE 802.3ae (10GBASE-R), 10 Gbit/s per direction; latency typical of kernel TCP (not a spec)",
    ),
    "IB-EDR": Link(
        "IB-EDR",
        100.0,
        0.6,
        # InfiniBand EDR 4x (IBTA Architecture Specification 1.3): 4 lanes x 25.78125 Gbit/s with 64b/66b
        # encoding = 100 Gbit/s; NVIDIA (Mellanox) ConnectX-5 product brief: "sub-600ns latency".
        "InfiniBand EDR 4x (IBTA spec 1.3), 100 Gbit/s; latency: NVIDIA ConnectX-5 product brief (< 600 ns)",
    ),
    "IB-NDR": Link(
        "IB-NDR",
        400.0,
        1.0,
        # InfiniBand NDR: NVIDIA ConnectX-7 / Quantum-2, one 400 Gbit/s port (ConnectX-7 user manual).
        # Latency: RDMA small-message latency, typical order 1 us (no vendor figure quoted).
        "InfiniBand NDR (NVIDIA ConnectX-7 user manual), 400 Gbit/s per port; latency typical of RDMA "
        "(~1 us)",
    ),
    "NVLink4": Link(
        "NVLink4",
        3600.0,
        2.0,
        # NVIDIA H100 SXM data sheet: 18 fourth-generation NVLink links, 900 GB/s total bidirectional per
        # GPU, i.e. 450 GB/s = 3600 Gbit/s per direction. Latency: GPU-to-GPU, typical order 1-2 us.
        "NVLink 4 (NVIDIA H100 SXM data sheet): 900 GB/s bidirectional = 450 GB/s = 3600 Gbit/s per "
        "direction; latency typical (~2 us)",
    ),
}
ALIASES: dict[str, str] = {"ib100": "IB-EDR", "ib400": "IB-NDR", "nvlink": "NVLink4"}


def named_link(name: str) -> Link:
    """The named interconnect (case-insensitive; ``IB100``, ``IB400``, ``NVLink`` are aliases)."""
    by_lower = {k.lower(): k for k in INTERCONNECTS} | ALIASES
    key = by_lower.get(str(name).lower())
    if key is None:
        raise invalid(
            "interconnect",
            name,
            f"not a named interconnect (known: {', '.join(INTERCONNECTS)})",
            "pick one of those, or give your own link's bandwidth_gbps and latency_us",
        )
    return INTERCONNECTS[key]


@dataclass(frozen=True)
class Layout:
    """Where the ledger's bytes travel: ``stages`` pipeline stages (``stages - 1`` boundary links),
        ``dp`` data-parallel replicas of the pipeline, ``points`` the ledger's compression points (each a
        possible boundary: ``L`` under ``method.points=all``, ``L - 1`` under ``boundaries``), the weight
        update's collective (``allreduce``: DDP, ring all-reduce of the update; ``rs_ag``: FSDP, the update
    reduced, reduce-scatter for dense gradients and ring all-reduce for compressed ones, then the parameters
    all-gathered: ``COLLECTIVES``), and
        ``micro_batches``, the micro-batches ``m`` each replica's tokens of one pass are split into (the
        pipeline's schedule: ``commrl.netmodel.cost.activation_time``), and ``gathers``, how many times
        ``rs_ag`` all-gathers the parameters in a tick (None: once per traversal and micro-batch, ``n m``:
        FSDP's ``reshard_after_forward``, verl's default and what the anchor needs, frees the parameters
        after each micro-batch's forward and gathers them again for its backward and the next one; 1: kept
        gathered through the tick, the least FSDP can send), and ``reduces``, how many times ``rs_ag``
        reduce-scatters the dense gradients in a tick (None: once per micro-batch, ``m``: verl's FSDP engine
        runs with ``use_no_sync_for_gradient_accumulation: false``, its generated config's value, and
        reduce-scatters after every micro-batch's backward; 1: accumulated, once per update; exact for one
        update a tick, as pair A takes)."""

    stages: int
    dp: int
    points: int
    collective: str = "allreduce"
    micro_batches: int = 1
    gathers: int | None = None
    reduces: int | None = None

    def __post_init__(self) -> None:
        for field in ("stages", "dp", "points", "micro_batches"):
            value = getattr(self, field)
            if not _integer(value) or value < 1:
                raise invalid(f"layout.{field}", value, "must be an integer >= 1", "give a whole number")
        for field, null in (
            ("gathers", "once per traversal and micro-batch"),
            ("reduces", "once per micro-batch"),
        ):
            value = getattr(self, field)
            if value is not None and (not _integer(value) or value < 1):
                raise invalid(
                    f"layout.{field}",
                    value,
                    f"must be an integer >= 1 or null ({null})",
                    "give a whole number, or null",
                )
        if self.stages - 1 > self.points:
            raise invalid(
                "layout.stages",
                self.stages,
                f"a pipeline of S stages has S - 1 boundaries, each at one of the {self.points} "
                f"compression points, so S <= {self.points + 1}",
                f"use at most {self.points + 1} stages",
            )
        if self.collective not in COLLECTIVES:
            raise invalid(
                "layout.collective", self.collective, f"one of {', '.join(COLLECTIVES)}", "pick one of those"
            )

    @property
    def boundaries(self) -> int:
        """``S - 1``: the stage boundaries activations cross."""
        return self.stages - 1

    def describe(self) -> str:
        if self.collective == "allreduce":
            collective = "ring all-reduce (DDP)"
        else:
            times = (
                "once per traversal and micro-batch" if self.gathers is None else f"{self.gathers}x a tick"
            )
            reduces = "once per micro-batch" if self.reduces is None else f"{self.reduces}x a tick"
            collective = (
                f"reduce-scatter of the dense gradients, {reduces} (a compressed update's factors "
                f"all-reduced after it), and all-gathers of the parameters, {times} (FSDP)"
            )
        return (
            f"{self.stages} pipeline stages ({self.boundaries} boundaries of {self.points} compression "
            f"points), {self.micro_batches} micro-batch{'es' if self.micro_batches != 1 else ''} per pass "
            f"and replica, data-parallel {self.dp}, weights by {collective}"
        )
