"""The two-circuit method (docs/method.md §2-§3).

Codecs, PowerSGD, sign memory, projection, anchor controller, byte ledger.
"""

from commrl.compression.activation import (
    BasisRefresh,
    IdentityCodec,
    LowRankActivationCodec,
    PRFMaskActivationCodec,
    energy_captured,
    lowrank_project,
    orth,
    prf_key,
    prf_mask,
    prf_uniform,
    random_orthonormal,
    sketch_step,
    sketch_update,
)
from commrl.compression.anchor import TwoCircuitController, build_codec
from commrl.compression.config import MethodConfig, compression_layers
from commrl.compression.hooks import SUPPORTED_MODEL_TYPES, CompressionPoints, decoder_layers
from commrl.compression.ledger import AnalyticBytes, ByteLedger, analytic_tick_bytes, qwen25_15b_shapes
from commrl.compression.powersgd import PowerSGD, WireBytes, cholesky_orth
from commrl.compression.projection import (
    SnapshotBuffer,
    project_tensor,
    quad4_projection,
    relex_projection,
    secant_projection,
)
from commrl.compression.sign_memory import DenseMemory, memory_update, sign_agreement, sign_correct

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "AnalyticBytes",
    "BasisRefresh",
    "ByteLedger",
    "CompressionPoints",
    "DenseMemory",
    "IdentityCodec",
    "LowRankActivationCodec",
    "MethodConfig",
    "PRFMaskActivationCodec",
    "PowerSGD",
    "SnapshotBuffer",
    "TwoCircuitController",
    "WireBytes",
    "analytic_tick_bytes",
    "build_codec",
    "cholesky_orth",
    "compression_layers",
    "decoder_layers",
    "energy_captured",
    "lowrank_project",
    "memory_update",
    "orth",
    "prf_key",
    "prf_mask",
    "prf_uniform",
    "project_tensor",
    "quad4_projection",
    "qwen25_15b_shapes",
    "random_orthonormal",
    "relex_projection",
    "secant_projection",
    "sign_agreement",
    "sign_correct",
    "sketch_step",
    "sketch_update",
]
