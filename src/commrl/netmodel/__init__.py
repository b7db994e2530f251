"""From bytes to seconds: a network cost model of one training tick (issue 17).

``cost``: the alpha-beta cost of each channel of the byte ledger (stage boundaries point to point, weight
updates by ring all-reduce (DDP) or, FSDP, reduce-scatter (compressed updates: all-reduce) + all-gather of
the parameters, basis refresh) and the tick's two overlap bounds;
``links``: named interconnects with their sources, links of one's own, the pipeline x data-parallel layout;
``inputs``: bytes and compute per tick from tracked runs (MLflow) or the analytic ledger; ``target``: time to
a target validation accuracy; ``analysis``: a pair at each link (tick times, speed-ups, crossover
bandwidth, time to target with intervals over seeds); ``config``: ``configs/netmodel/pair_<pair>.yaml``.
``commrl netmodel`` is the command line, ``commrl.report.network`` the figures and tables.
"""

from commrl.netmodel.analysis import NetworkResult, PairInputs, Sweep, evaluate
from commrl.netmodel.config import NetmodelConfig, load_config, pair_config_path, pair_inputs
from commrl.netmodel.cost import (
    ChannelBytes,
    CommTime,
    Crossover,
    all_gather_time,
    comm_time,
    crossover_bandwidth,
    p2p_time,
    reduce_scatter_time,
    ring_allreduce_time,
    tick_time,
)
from commrl.netmodel.inputs import AnalyticSpec, Compute, Qwen2Shape, TickInputs, qwen2_weight_shapes
from commrl.netmodel.links import INTERCONNECTS, Layout, Link, NetModelError, named_link
from commrl.netmodel.target import Reach, Target, dense_target, time_to_target

__all__ = [
    "INTERCONNECTS",
    "AnalyticSpec",
    "ChannelBytes",
    "CommTime",
    "Compute",
    "Crossover",
    "Layout",
    "Link",
    "NetModelError",
    "NetmodelConfig",
    "NetworkResult",
    "PairInputs",
    "Qwen2Shape",
    "Reach",
    "Sweep",
    "Target",
    "TickInputs",
    "all_gather_time",
    "comm_time",
    "crossover_bandwidth",
    "dense_target",
    "evaluate",
    "load_config",
    "named_link",
    "p2p_time",
    "pair_config_path",
    "pair_inputs",
    "qwen2_weight_shapes",
    "reduce_scatter_time",
    "ring_allreduce_time",
    "tick_time",
    "time_to_target",
]
