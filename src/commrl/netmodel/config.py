"""A pair's network-model config (``configs/netmodel/pair_<pair>.yaml``) and the inputs it leads to.

Keys: ``pair``; ``bytes`` (``runs``: bytes per tick from the runs' ``comm/*``, compute from their
``time/*``; ``analytic``: bytes of ``model`` and ``analytic`` as verl's engine counts them, compute from
``compute``); ``compressed`` (the condition compared with dense); ``layout`` (``stages``, ``dp``,
``collective``, ``micro_batches``, ``gathers``, ``reduces``; ``points`` with ``bytes: runs``, derived from the
model with ``analytic``); ``passes`` (``bytes: runs`` only: the boundary traversals the runs' driver counts on
a ``fast`` tick and on a ``fire`` tick, derived from the engine's passes with ``analytic``); ``element_bytes``
(``bytes: runs`` only: ``grads``, the element size of the gradients the runs' ``comm/bytes_weights``
counts, and ``params``, that of the parameters FSDP (``rs_ag``) all-gathers; ``analytic.grad_bytes`` and
``analytic.param_bytes`` with ``analytic``);
``target_fraction``; ``interconnects`` (names of ``commrl.netmodel.links.INTERCONNECTS``); ``sweep``
(``low_gbps``, ``high_gbps``, ``latency_us``, ``tolerance``); ``compute_note`` (what the compute times are,
printed with every result). Unknown keys and bad values fail naming the key and the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from commrl.config_tree import REPO
from commrl.netmodel.analysis import ANALYTIC_SEED, DENSE, PairInputs, Sweep
from commrl.netmodel.inputs import (
    PARAM_BYTES_WHAT,
    AnalyticSpec,
    Compute,
    Qwen2Shape,
    analytic_inputs,
    element_size,
    measured_inputs,
    store_client,
)
from commrl.netmodel.links import Layout, NetModelError, named_link
from commrl.report import curves as cv
from commrl.report.runs import PairRuns, ReportInputError, load_pair

CONFIG_ENV = "COMMRL_NETMODEL_CONFIGS"
SOURCES = ("runs", "analytic")
TOP_KEYS = {
    "pair",
    "bytes",
    "compressed",
    "layout",
    "target_fraction",
    "interconnects",
    "sweep",
    "compute_note",
    "model",
    "analytic",
    "compute",
    "passes",
    "element_bytes",
}
ANALYTIC_ONLY = ("model", "analytic", "compute")


def config_dir() -> Path:
    """``$COMMRL_NETMODEL_CONFIGS``, else ``configs/netmodel`` under the working directory or the
    repository."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env).resolve()
    for root in (Path.cwd(), REPO):
        candidate = root / "configs" / "netmodel"
        if candidate.is_dir():
            return candidate.resolve()
    raise NetModelError(
        "config", f"cannot find configs/netmodel; run from the repository root or set {CONFIG_ENV}"
    )


def pair_config_path(pair: str) -> Path:
    """``<config_dir>/pair_<pair>.yaml``; ``NetModelError`` naming the pairs that have one when missing."""
    directory = config_dir()
    path = directory / f"pair_{pair}.yaml"
    if not path.is_file():
        known = sorted(p.stem.removeprefix("pair_") for p in directory.glob("pair_*.yaml"))
        known_text = ", ".join(known) or "none"
        raise NetModelError(
            "pair", f"pair {pair!r} has no {path} (pairs with a config: {known_text}); pass --config"
        )
    return path


@dataclass(frozen=True)
class NetmodelConfig:
    """One pair's network-model settings (see the module docstring); ``path`` is the file it came from."""

    pair: str
    source: str
    compressed: str
    layout: Layout
    target_fraction: float
    interconnects: tuple[str, ...]
    sweep: Sweep
    compute_note: str
    analytic: AnalyticSpec | None = None
    compute: Compute | None = None
    ticks: int = 0
    passes: dict[str, int] | None = None
    element_bytes: dict[str, int] | None = None
    path: str = ""

    @property
    def param_scale(self) -> float:
        """The parameters' element size over the gradients' (``rs_ag`` all-gathers this times the dense
        update's bytes): ``analytic.param_bytes / analytic.grad_bytes``, or ``element_bytes``'
        ``params / grads``."""
        if self.analytic is not None:
            return self.analytic.param_scale
        assert self.element_bytes is not None  # a runs config has them (_build)
        return self.element_bytes["params"] / self.element_bytes["grads"]

    def with_overrides(
        self,
        stages: int | None = None,
        dp: int | None = None,
        collective: str | None = None,
        compute: Compute | None = None,
        tokens_per_tick: int | None = None,
        target_fraction: float | None = None,
        micro_batches: int | None = None,
        gathers: int | None = None,
        reduces: int | None = None,
    ) -> NetmodelConfig:
        """The same config with the given values replaced (validated again)."""
        layout = Layout(
            self.layout.stages if stages is None else stages,
            self.layout.dp if dp is None else dp,
            self.layout.points,
            self.layout.collective if collective is None else collective,
            self.layout.micro_batches if micro_batches is None else micro_batches,
            self.layout.gathers if gathers is None else gathers,
            self.layout.reduces if reduces is None else reduces,
        )
        if (compute is not None or tokens_per_tick is not None) and self.source != "analytic":
            flag = "compute" if compute is not None else "tokens_per_tick"
            raise NetModelError(
                flag,
                f"{flag} applies to analytic pairs; pair {self.pair}'s bytes and compute come from its runs",
            )
        analytic = self.analytic
        if tokens_per_tick is not None and analytic is not None:
            analytic = replace(analytic, tokens_per_tick=tokens_per_tick)
        fraction = self.target_fraction if target_fraction is None else target_fraction
        _fraction(fraction, "target_fraction")
        return replace(
            self,
            layout=layout,
            analytic=analytic,
            compute=self.compute if compute is None else compute,
            target_fraction=fraction,
        )


def _fraction(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise NetModelError(key, f"{key}={value!r} is invalid: a fraction in (0, 1], e.g. 0.95")
    return float(value)


def _mapping(data: Any, key: str) -> dict:
    if not isinstance(data, dict):
        raise NetModelError(key, f"{key} must be a mapping, got {type(data).__name__}")
    return data


def _passes(data: Any) -> dict[str, int]:
    """``{fast: n, fire: n}``: the boundary traversals (each counted pass's forward, each backward) the
    runs' driver counts on a fast tick and on a fire tick."""
    if data is None:
        raise NetModelError(
            "passes", "passes is missing: {fast: n, fire: n}, the traversals the runs' driver counts per tick"
        )
    passes = _mapping(data, "passes")
    if set(passes) != {"fast", "fire"}:
        raise NetModelError("passes", f"passes must have the keys fast and fire, got {sorted(passes)}")
    for key, value in passes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise NetModelError(f"passes.{key}", f"passes.{key}={value!r} must be an integer >= 1")
    return dict(passes)


def _element_bytes(data: Any) -> dict[str, int]:
    """``{grads: n, params: n}``: the element size of the gradients the runs' ``comm/bytes_weights`` counts
    and of the parameters FSDP (``rs_ag``) all-gathers."""
    if data is None:
        raise NetModelError(
            "element_bytes",
            "element_bytes is missing: {grads: n, params: n}, the element sizes in bytes of the gradients "
            "the runs' comm/bytes_weights counts and of the parameters FSDP (rs_ag) all-gathers",
        )
    sizes = _mapping(data, "element_bytes")
    if set(sizes) != {"grads", "params"}:
        raise NetModelError(
            "element_bytes", f"element_bytes must have the keys grads and params, got {sorted(sizes)}"
        )
    what = "the element size in bytes of the gradients the runs' comm/bytes_weights counts (4 for fp32)"
    return {
        "grads": element_size(sizes["grads"], "element_bytes.grads", what),
        "params": element_size(sizes["params"], "element_bytes.params", PARAM_BYTES_WHAT),
    }


def _build(data: dict, path: str) -> NetmodelConfig:
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        known = ", ".join(sorted(TOP_KEYS))
        raise NetModelError(unknown[0], f"unknown key(s) {', '.join(unknown)}; known: {known}")
    for key in ("pair", "bytes", "layout", "compute_note"):
        if key not in data:
            raise NetModelError(key, f"{key} is missing")
    source = data["bytes"]
    if source not in SOURCES:
        raise NetModelError("bytes", f"bytes={source!r} is invalid: one of {', '.join(SOURCES)}")
    compressed = str(data.get("compressed", "method"))
    if compressed == DENSE:
        raise NetModelError(
            "compressed", "compressed=dense is invalid: name the condition compared with dense"
        )
    layout_data = dict(_mapping(data["layout"], "layout"))
    extra = sorted(set(layout_data) - {f.name for f in fields(Layout)})
    if extra:
        raise NetModelError(f"layout.{extra[0]}", f"unknown layout key(s) {', '.join(extra)}")
    interconnects = tuple(str(n) for n in data.get("interconnects", ()))
    for name in interconnects:
        named_link(name)
    sweep_data = _mapping(data.get("sweep", {}), "sweep")
    try:
        sweep = Sweep(**sweep_data)
    except TypeError as err:
        keys = "low_gbps, high_gbps, latency_us, tolerance"
        raise NetModelError("sweep", f"sweep: {err}; keys: {keys}") from None
    common = {
        "pair": str(data["pair"]),
        "compressed": compressed,
        "target_fraction": _fraction(data.get("target_fraction", 0.95), "target_fraction"),
        "interconnects": interconnects,
        "sweep": sweep,
        "compute_note": str(data["compute_note"]).strip(),
        "path": path,
    }
    if source == "runs":
        present = [k for k in ANALYTIC_ONLY if k in data]
        if present:
            raise NetModelError(present[0], f"{present[0]} applies to bytes: analytic only")
        if "points" not in layout_data:
            raise NetModelError("layout.points", "layout.points is missing: the ledger's compression points")
        passes = _passes(data.get("passes"))
        sizes = _element_bytes(data.get("element_bytes"))
        return NetmodelConfig(
            source="runs", layout=Layout(**layout_data), passes=passes, element_bytes=sizes, **common
        )
    if compressed != "method":
        raise NetModelError("compressed", "bytes: analytic models the method only; set compressed: method")
    if "passes" in data:
        raise NetModelError("passes", "passes applies to bytes: runs only (analytic: the engine's passes)")
    if "element_bytes" in data:
        raise NetModelError(
            "element_bytes",
            "element_bytes applies to bytes: runs only "
            "(analytic: analytic.grad_bytes and analytic.param_bytes)",
        )
    if "points" in layout_data:
        raise NetModelError(
            "layout.points", "layout.points is derived from model and analytic.points; remove it"
        )
    model = Qwen2Shape(**_mapping(data.get("model"), "model"))
    analytic_data = dict(_mapping(data.get("analytic"), "analytic"))
    ticks = analytic_data.pop("ticks", 100)
    try:
        spec = AnalyticSpec(model=model, **analytic_data)
    except TypeError as err:
        raise NetModelError("analytic", f"analytic: {err}") from None
    if isinstance(ticks, bool) or not isinstance(ticks, int) or ticks < 1:
        raise NetModelError("analytic.ticks", f"analytic.ticks={ticks!r} must be an integer >= 1")
    compute = Compute(**_mapping(data.get("compute", {"train_s": None}), "compute"))
    layout = Layout(points=spec.n_points, **layout_data)
    return NetmodelConfig(
        source="analytic", layout=layout, analytic=spec, compute=compute, ticks=ticks, **common
    )


def load_config(path: str | Path) -> NetmodelConfig:
    """The config in ``path``; every error names the file and the key."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise NetModelError("config", f"config {p} does not exist")
    try:
        return _build(_mapping(yaml.safe_load(p.read_text()), str(p)), str(p))
    except (NetModelError, TypeError) as err:
        field = getattr(err, "field", "config")
        raise NetModelError(field, f"{p}: {err}") from None


def pair_inputs(
    cfg: NetmodelConfig, tracking_uri: str | None = None, runs: PairRuns | None = None
) -> PairInputs:
    """The model's inputs for ``cfg``: tick inputs from the runs (``bytes: runs``; ``runs`` or the store's
    pair) or the analytic ledger; ``val/acc`` from the tracked runs when there are any."""
    notes: list[str] = []
    conditions = (DENSE, cfg.compressed)
    if runs is None:
        try:
            store_client(tracking_uri)  # a missing sqlite store is an error, not a new empty store
            runs = load_pair(cfg.pair, tracking_uri)
        except (ReportInputError, NetModelError) as err:
            if cfg.source == "runs":
                raise
            notes.append(f"{cfg.pair}: no tracked runs ({err}); no time to target")
    val = {c: cv.seed_series(runs, c, "val/acc") for c in conditions} if runs is not None else {}
    read_at = runs.read_at() if runs is not None else None
    if cfg.source == "runs":
        assert cfg.passes is not None  # a runs config has them (_build)
        ticks, read_notes = measured_inputs(runs, conditions, tracking_uri, cfg.passes, cfg.param_scale)
        notes += read_notes
        return PairInputs(
            cfg.pair,
            "runs",
            cfg.layout,
            cfg.compressed,
            ticks,
            val,
            True,
            cfg.compute_note,
            tuple(notes),
            read_at,
        )
    horizon = max([int(s.steps.max()) for per in val.values() for s in per.values()] + [cfg.ticks])
    compute = cfg.compute or Compute(None)
    schedule = analytic_inputs(cfg.analytic, compute, horizon, cfg.layout.stages)
    ticks = {c: {ANALYTIC_SEED: schedule[c]} for c in conditions}
    note = compute.describe() if compute.known else cfg.compute_note
    return PairInputs(
        cfg.pair,
        "analytic",
        cfg.layout,
        cfg.compressed,
        ticks,
        val,
        compute.known,
        note,
        tuple(notes),
        read_at,
    )
