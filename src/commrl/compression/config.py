"""The method's knobs: one frozen dataclass, defaults from ``docs/method.md`` §2-§3.

``MethodConfig.validate(hidden_size)`` raises ``ConfigError`` naming the field, its value and the allowed
range. The checks that need no model run at construction; ``rank < hidden_size`` (and the default
``prf_keep = rank / hidden``) are checked once the model's width is known.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from commrl.errors import ConfigError

CODECS = ("identity", "lowrank", "prf_mask")
GRAD_CODECS = ("none", "powersgd")
PROJECTIONS = ("none", "secant", "quad4", "progressive", "relex")
KL_REF_FORWARDS = ("codec", "dense")
POINTS = ("all", "boundaries")
SIGN_SCOPES = ("all", "compressed")


def _fail(field: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"method.{field}={value!r} is invalid: {allowed}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class MethodConfig:
    """Two-circuit method settings (method.md §2 fast circuit, §3 anchor circuit, §4 read-outs).

    ``prf_keep=None`` means ``rank / hidden`` (as many bytes as ``lowrank``), ``grad_rank=None`` means
    ``rank``, ``delay=None`` means ``cadence`` (the note's "matching freshness delay"). The readings of
    method.md: ``points`` (``all``: every decoder layer's output; ``boundaries``: all but the last, whose
    output feeds the LM head on the same stage), ``sign_scope`` (``all``: every trainable parameter;
    ``compressed``: the PowerSGD-compressed matrices only), ``fast_step`` (false: fast ticks take no
    optimizer step, only the anchor's dense updates move the weights), ``grad_cosine_every`` (an extra
    forward+backward through the codec on a fire tick for ``anchor/grad_cosine_*``, at the first fire at or
    after each multiple of that many ticks: 1 every fire, 0 never; ``grad_cosine_due``).
    """

    codec: str = "lowrank"
    rank: int = 77
    prf_keep: float | None = None
    grad_codec: str = "powersgd"
    grad_rank: int | None = None
    min_compression_rate: float = 2.0
    anchor: bool = True
    cadence: int = 20
    delay: int | None = None
    projection: str = "secant"
    projection_scale: float = 1.0
    progressive_fires: int = 3
    relex_window: int = 4
    alpha: float = 0.25
    beta: float = 0.25
    kl_ref_forward: str = "codec"
    points: str = "all"
    sign_scope: str = "all"
    fast_step: bool = True
    grad_cosine_every: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> MethodConfig:
        """Build from a plain mapping (a Hydra node made a dict); unknown keys are named and rejected."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown method setting(s) {', '.join('method.' + k for k in unknown)}; known settings: "
                f"{', '.join(sorted(known))}"
            )
        return cls(**dict(values))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self, hidden_size: int | None = None) -> MethodConfig:
        """Check every field; with ``hidden_size`` also ``rank < hidden_size`` and the default keep rate.

        Returns ``self`` so that ``cfg = MethodConfig(...).validate(hidden)`` reads naturally.
        """
        self._check_choice("codec", CODECS)
        self._check_choice("grad_codec", GRAD_CODECS)
        self._check_choice("projection", PROJECTIONS)
        self._check_choice("kl_ref_forward", KL_REF_FORWARDS)
        self._check_choice("points", POINTS)
        self._check_choice("sign_scope", SIGN_SCOPES)
        for flag in ("anchor", "fast_step"):
            if not isinstance(getattr(self, flag), bool):
                raise _fail(flag, getattr(self, flag), "must be true or false")
        if not _is_int(self.rank) or self.rank < 1:
            raise _fail("rank", self.rank, "must be an integer >= 1 (and < the model's hidden size)")
        if hidden_size is not None and self.rank >= hidden_size:
            raise _fail("rank", self.rank, f"must be >= 1 and < hidden_size={hidden_size}; lower method.rank")
        if not _is_int(self.grad_cosine_every) or self.grad_cosine_every < 0:
            raise _fail(
                "grad_cosine_every",
                self.grad_cosine_every,
                "must be an integer >= 0: ticks between gradient-cosine diagnostics (1: every fire, "
                "0: never)",
            )
        if self.grad_rank is not None and (not _is_int(self.grad_rank) or self.grad_rank < 1):
            raise _fail("grad_rank", self.grad_rank, "must be an integer >= 1, or null (= method.rank)")
        if self.prf_keep is not None and not (_is_number(self.prf_keep) and 0.0 < self.prf_keep <= 1.0):
            raise _fail("prf_keep", self.prf_keep, "must be in (0, 1], or null (= rank / hidden_size)")
        if self.prf_keep is not None and self.codec != "prf_mask":
            raise _fail(
                "prf_keep",
                self.prf_keep,
                f"it sets the keep rate of codec prf_mask, but method.codec={self.codec!r}; set "
                "method.prf_keep=null or method.codec=prf_mask",
            )
        if not _is_number(self.min_compression_rate) or self.min_compression_rate < 1.0:
            raise _fail(
                "min_compression_rate",
                self.min_compression_rate,
                "must be a number >= 1 (a compressed matrix must not be larger than the dense one)",
            )
        if not _is_int(self.cadence) or self.cadence < 1:
            raise _fail(
                "cadence", self.cadence, "must be an integer >= 1 (anchor fires every `cadence` ticks)"
            )
        if self.delay is not None and (not _is_int(self.delay) or self.delay < 0):
            raise _fail("delay", self.delay, "must be an integer >= 0, or null (= method.cadence)")
        if not _is_number(self.projection_scale) or self.projection_scale < 0:
            raise _fail("projection_scale", self.projection_scale, "must be a number >= 0")
        if not _is_int(self.progressive_fires) or self.progressive_fires < 1:
            raise _fail("progressive_fires", self.progressive_fires, "must be an integer >= 1")
        if not _is_int(self.relex_window) or self.relex_window < 2:
            raise _fail("relex_window", self.relex_window, "must be an integer >= 2 (2 is the secant)")
        if not _is_number(self.alpha) or not 0.0 <= self.alpha <= 1.0:
            raise _fail("alpha", self.alpha, "must be in [0, 1] (1 = no sign correction)")
        if not _is_number(self.beta) or not 0.0 <= self.beta < 1.0:
            raise _fail("beta", self.beta, "must be in [0, 1) (0 = memory is the newest dense gradient)")
        if not _is_int(self.seed) or not 0 <= self.seed < 2**32:
            raise _fail("seed", self.seed, "must be an integer in [0, 2**32) (PowerSGD's numpy generator)")
        if self.sign_scope == "compressed" and self.grad_codec != "powersgd":
            raise _fail(
                "sign_scope",
                self.sign_scope,
                f"with method.grad_codec={self.grad_codec!r} no matrix is compressed, so nothing would be "
                "sign-corrected; set method.sign_scope=all or method.grad_codec=powersgd",
            )
        if not self.fast_step and not self.anchor:
            raise _fail(
                "fast_step",
                self.fast_step,
                "with method.anchor=false no tick would update the weights; set method.anchor=true "
                "(the anchor-only control) or method.fast_step=true",
            )
        if hidden_size is not None:
            self.keep_prob(hidden_size)
        return self

    def _check_choice(self, field: str, allowed: tuple[str, ...]) -> None:
        value = getattr(self, field)
        if value not in allowed:
            raise _fail(field, value, f"must be one of {', '.join(allowed)}")

    def effective_delay(self) -> int:
        """Anchor freshness delay ``h`` (method.md §3.1): ``delay``, or ``cadence`` when unset."""
        return self.cadence if self.delay is None else self.delay

    def fires_at(self, tick: int) -> bool:
        """Whether the anchor fires at ``tick``: anchor on and ``t = 0, K, 2K, ...`` (method.md §3)."""
        return self.anchor and tick % self.cadence == 0

    def calibration_due(self, tick: int) -> bool:
        """Whether ``tick`` calibrates the basis before its first pass through the codec: the anchor off,
        ``t = 0`` and a codec with a basis (``lowrank``); no fire refreshes it (method.md §3)."""
        return not self.anchor and tick == 0 and self.codec == "lowrank"

    def dense_reference_due(self, tick: int) -> bool:
        """Whether ``tick``'s updates need the reference's dense log-probs besides the codec's: a fire tick
        whose reference pass goes through a codec (``kl_ref_forward: codec``, not ``identity``). The
        anchor's replay is dense (method.md §3.3), its KL term against the dense reference too."""
        return self.fires_at(tick) and self.kl_ref_forward == "codec" and self.codec != "identity"

    def grad_cosine_due(self, tick: int) -> bool:
        """Whether the fire at ``tick`` runs the gradient-cosine diagnostic (method.md §4): with
        ``N = grad_cosine_every > 0``, when a multiple of ``N`` lies in ``(tick - cadence, tick]``, i.e. the
        first fire at or after each multiple of ``N`` ticks (every fire when ``N <= cadence``). Pure in the
        tick, so a resumed run measures the same fires."""
        n = self.grad_cosine_every
        return n > 0 and tick // n > (tick - self.cadence) // n

    def effective_grad_rank(self) -> int:
        """PowerSGD rank (method.md §2): ``grad_rank``, or the activation ``rank`` when unset."""
        return self.rank if self.grad_rank is None else self.grad_rank

    def keep_prob(self, hidden_size: int) -> float:
        """PRF-mask keep probability ``p`` (method.md §2): ``prf_keep``, or ``rank / hidden_size``."""
        if not _is_int(hidden_size) or hidden_size < 1:
            raise ConfigError(f"hidden_size={hidden_size!r} is invalid: must be an integer >= 1")
        p = self.rank / hidden_size if self.prf_keep is None else float(self.prf_keep)
        if not 0.0 < p <= 1.0:
            raise _fail(
                "prf_keep",
                self.prf_keep,
                f"rank / hidden_size = {p:.3f} is not in (0, 1]; set method.prf_keep",
            )
        return p


def compression_layers(num_layers: int, points: str) -> list[int]:
    """The decoder layers whose output is a compression point (method.md §2, ``method.points``).

    ``all``: every layer, ``0 .. L-1``. ``boundaries``: ``0 .. L-2``, the outputs a pipeline stage boundary
    can follow; the last layer's output feeds the final norm and the LM head on the last layer's own stage
    and crosses no boundary, so it is neither compressed nor counted as a communicated tensor.
    """
    if points not in POINTS:
        raise _fail("points", points, f"must be one of {', '.join(POINTS)}")
    if not _is_int(num_layers) or num_layers < 1:
        raise ConfigError(f"num_layers={num_layers!r} is invalid: must be an integer >= 1")
    layers = list(range(num_layers if points == "all" else num_layers - 1))
    if not layers:
        raise _fail(
            "points",
            points,
            "a model with one decoder layer has no pipeline boundary to compress; set method.points=all",
        )
    return layers
