"""The report's network section, built from the synthetic store of ``tests/report/conftest.py`` (pair A's
dense and method runs): from the runs' bytes and times, and from pair A's analytic ledger with a given
compute time; and ``commrl netmodel`` on the same store."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from commrl.cli.main import main
from commrl.compression.ledger import pair_a_summary
from commrl.netmodel import ChannelBytes, Compute, Layout, comm_time, load_config, named_link
from commrl.netmodel.config import config_dir

NETWORK_FIGURES = [
    "fig12_net_tick_runs_A.png",
    "fig13_net_target_runs_A.png",
    "fig12_net_tick_analytic_A.png",
    "fig13_net_target_analytic_A.png",
]
ALPHA, BETA = 50e-6, 1e9 / 8  # 1GbE: 50 us, 1.25e8 bytes/s


def dense_seconds_to_target_1gbe(series) -> float:
    """The store's dense seeds reach 0.95 x 0.67 at step 50; per tick, no overlap: sample 0.2 s + train
    0.5 + 0.01 (k - 1) s + activations 8e8 / (4 points x 2 replicas) bytes in 4 micro-batches across 4
    boundaries, (4 + 5 - 2) / 4 of them and 2 traversals x 7 messages + weights 2e8 / 5 stages (the runs
    give no model shape) ring-all-reduced over 2 ranks (2 (2-1)/2 x bytes, 2 latencies)."""
    activations, weights = series.NETWORK_BYTES["dense"]
    comm = 2 * 7 * ALPHA + 7 / 4 * activations / 8 / BETA + 2 * ALPHA + weights / 5 / BETA
    return 50 * (series.SAMPLE_S + series.TRAIN_S + comm)


@pytest.fixture(scope="module")
def built(net_store_uri, runs_config, tmp_path_factory):
    from commrl.report import build_report
    from commrl.report.network import NetworkOptions

    analytic = load_config(config_dir() / "pair_A.yaml").with_overrides(compute=Compute(400.0, source="test"))
    tiny = load_config(config_dir() / "pair_tiny.yaml")  # a pair the report does not include
    options = NetworkOptions((load_config(runs_config), analytic, tiny))
    out = tmp_path_factory.mktemp("netreport") / "report"
    return build_report(["A"], out, tracking_uri=net_store_uri, network=options)


def test_the_report_draws_and_embeds_the_network_figures(built):
    out = built.out_dir
    for name in NETWORK_FIGURES:
        with Image.open(out / name) as img:
            img.verify()
    md = (out / "report.md").read_text()
    assert "## From bytes to seconds: the network model" in md
    assert "### Pair A (tracked runs)" in md and "### Pair A (analytic ledger)" in md
    assert all(f"]({name})" in md for name in NETWORK_FIGURES)
    drawn = [p.name for p in out.glob("*.png")]
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(drawn)
    captions = json.loads((out / "captions.json").read_text())
    assert set(NETWORK_FIGURES) <= set(captions) and set(captions) == set(drawn)
    assert "crossover" in captions["fig12_net_tick_runs_A.png"]
    assert sorted(p.name for p in built.files) == sorted(p.name for p in out.iterdir())
    assert "network model of pair tiny skipped: the report does not include the pair" in built.notes


def test_time_to_target_from_the_runs_matches_the_hand_computation(built, series):
    data = json.loads((built.out_dir / "tables.json").read_text())["network"]
    assert set(data) == {"A-runs", "A-analytic"}
    table = data["A-runs"]["tables"]["network_links_A_runs"]
    col = {name: i for i, name in enumerate(table["columns"])}
    row = next(r for r in table["rows"] if r[0] == "1GbE" and r[col["overlap"]] == "no overlap")
    dense = row[col["dense to target (s)"]]
    assert dense["n"] == 3 and dense["mean"] == pytest.approx(dense_seconds_to_target_1gbe(series), rel=1e-9)
    assert dense["low"] < dense["mean"] < dense["high"]  # the seeds' train times differ by 0.01 s
    assert row[col["reached (dense, method)"]] == "3/3, 3/3"
    assert row[col["speed-up to target"]]["mean"] > 1.5  # 10x fewer bytes on a slow link
    crossover = data["A-runs"]["tables"]["network_crossover_A_runs"]["rows"]
    assert crossover[0][0] == "no overlap" and 1 < crossover[0][1] < 400


def test_time_to_target_from_the_analytic_ledger(built):
    """Pair A's tracked val/acc reaches the target at step 50; dense's tick at 1GbE, no overlap, is 400 s
    of compute plus dense's tick on 4 stages x 8 replicas, 86 micro-batches: the engine's 4 traversals
    (twice the ledger's two training passes), the last stage's share of the update (reduce-scatter of the
    fp32 gradients + all-gather of the bf16 parameters, half their bytes)."""
    section = next(n for n in built.network if n.key == "A-analytic")
    table = next(t for t in section.tables if t.key == "network_links_A_analytic")
    row = next(r for r in table.rows if r[0] == "1GbE" and r[3] == "no overlap")
    b, spec = pair_a_summary(), load_config(config_dir() / "pair_A.yaml").analytic
    share = spec.stage_weight_bytes(4)["dense"]
    nbytes = ChannelBytes(2 * b.dense_activations, 0.0, b.dense_weights, 4, share, param_scale=0.5)
    comm = comm_time(nbytes, Layout(4, 8, 28, "rs_ag", 86), named_link("1GbE"))
    dense = row[table.columns.index("dense to target (s)")]
    assert dense.estimate == pytest.approx(50 * (400 + comm.total), rel=1e-9)
    assert "source: test" in section.summary and "analytic ledger" in section.summary


def test_rs_ag_gathers_the_dense_runs_parameters_after_the_methods_update(net_store_uri, runs_config, series):
    """``bytes: runs`` under FSDP (``rs_ag``, reduced and gathered once a tick): the method's gradients are
    reduce-scattered dense as dense's are, dense's 2e8 update bytes a tick (5 stages, 2 replicas), 1 latency
    + 1/2 x 2e8 / 5 / beta, its 2e7 factor bytes ring-all-reduced after, 2 latencies + 2e7 / 5 / beta, and
    the parameters all-gathered dense, 1 latency + 1/2 x 2e8 / 5 / beta; dense reduce-scatters and
    all-gathers its own."""
    import numpy as np

    from commrl.netmodel import pair_inputs

    pi = pair_inputs(
        load_config(runs_config).with_overrides(collective="rs_ag", gathers=1, reduces=1), net_store_uri
    )
    dense_w, method_w = series.NETWORK_BYTES["dense"][1], series.NETWORK_BYTES["method"][1]
    link = named_link("1GbE")
    for seed, method in pi.ticks["method"].items():
        assert np.all(method.params == dense_w), seed
        t = method.comm(pi.layout, link).weights
        reduce = gather = ALPHA + dense_w / 10 / BETA
        assert np.allclose(t, reduce + 2 * ALPHA + method_w / 5 / BETA + gather, rtol=1e-12)
    for dense in pi.ticks["dense"].values():
        assert dense.params is None
        t = dense.comm(pi.layout, link).weights
        assert np.allclose(t, 2 * (ALPHA + dense_w / 10 / BETA), rtol=1e-12)


def test_rs_ag_gathers_the_runs_parameters_at_the_configs_element_size(
    net_store_uri, runs_config, series, tmp_path
):
    """``element_bytes: {grads: 4, params: 2}`` (fp32 gradients in the ledger, bf16 parameters gathered, as
    verl's FSDP does by default): every all-gather carries half of dense's 2e8 update bytes a tick, the
    method's after its reduce-scattered 2e8 and all-reduced 2e7 and dense's after its reduce-scattered 2e8."""
    import numpy as np

    from commrl.netmodel import pair_inputs

    path = tmp_path / "pair_A_bf16.yaml"
    path.write_text(runs_config.read_text().replace("params: 4}", "params: 2}"))
    cfg = load_config(path).with_overrides(collective="rs_ag", gathers=1, reduces=1)
    assert cfg.param_scale == 0.5
    pi = pair_inputs(cfg, net_store_uri)
    dense_w, method_w = series.NETWORK_BYTES["dense"][1], series.NETWORK_BYTES["method"][1]
    link, gather = named_link("1GbE"), ALPHA + dense_w / 2 / 10 / BETA
    for method in pi.ticks["method"].values():
        t = method.comm(pi.layout, link).weights
        reduce = ALPHA + dense_w / 10 / BETA  # the dense reduce-scatter before the factors' all-reduce
        assert np.allclose(t, reduce + 2 * ALPHA + method_w / 5 / BETA + gather, rtol=1e-12)
    for dense in pi.ticks["dense"].values():
        t = dense.comm(pi.layout, link).weights
        assert np.allclose(t, ALPHA + dense_w / 10 / BETA + gather, rtol=1e-12)


def test_the_command_reads_the_store(net_store_uri, runs_config, series, capsys):
    argv = ["netmodel", "--pair", "A", "--config", str(runs_config), "--tracking-uri", net_store_uri]
    assert main([*argv, "--link", "1GbE"]) == 0
    out = capsys.readouterr().out
    assert "runs per condition: dense 3, method 3" in out
    assert f"{dense_seconds_to_target_1gbe(series):.5g}" in out and "(3/3 seeds)" in out


def test_figure_12_captions_say_how_ticks_are_averaged_and_name_the_links_left_off(built):
    """The runs: a mean over a run's ticks, then seeds, every named link in range; the analytic ledger: one
    schedule of 100 ticks, no seeds, and NVLink4 (3600 Gbit/s) above the plotted 0.1-400 Gbit/s."""
    captions = json.loads((built.out_dir / "captions.json").read_text())
    runs, analytic = captions["fig12_net_tick_runs_A.png"], captions["fig12_net_tick_analytic_A.png"]
    assert "(mean over the ticks of a run, then over seeds)" in runs
    assert "Dotted: the named interconnects." in runs and "not drawn" not in runs
    assert "(mean over the 100 ticks of the analytic schedule, which has no seeds)" in analytic
    assert "over seeds" not in analytic
    left_off = "outside the plotted 0.1-400 Gbit/s and not drawn: NVLink4 (3600 Gbit/s)."
    assert f"Dotted: the named interconnects; {left_off}" in analytic


def test_the_links_table_has_one_row_per_interconnect_when_only_communication_is_modelled(tmp_path):
    """Pair A without a compute time: the no-overlap and full-overlap bounds are both the communication
    time, so the table has one row per interconnect whose overlap cell says the bounds coincide, not two
    identical rows that read like two measurements; with a compute time, one row per bound."""
    from commrl.netmodel import evaluate, pair_inputs
    from commrl.report.network import COMM_ONLY, links_table

    cfg = load_config(config_dir() / "pair_A.yaml")
    uri = f"sqlite:///{tmp_path / 'none.db'}"
    links = [named_link(n) for n in cfg.interconnects]
    unknown = links_table(evaluate(pair_inputs(cfg, uri), links, cfg.sweep, cfg.target_fraction))
    col = {name: i for i, name in enumerate(unknown.columns)}
    assert [r[0] for r in unknown.rows] == list(cfg.interconnects)
    assert all(r[col["overlap"]] == COMM_ONLY for r in unknown.rows)
    assert "bounds coincide" in COMM_ONLY and "communication only" in COMM_ONLY
    gbe = unknown.rows[0]
    assert gbe[col["dense comm (s/tick)"]] > gbe[col["method comm (s/tick)"]] > 0
    assert gbe[col["dense tick (s)"]] is None and gbe[col["tick speed-up"]] is None
    known = cfg.with_overrides(compute=Compute(400.0, source="test"))
    table = links_table(evaluate(pair_inputs(known, uri), links, known.sweep, known.target_fraction))
    assert [(r[0], r[col["overlap"]]) for r in table.rows[:2]] == [
        ("1GbE", "no overlap"),
        ("1GbE", "full overlap"),
    ]
    assert len(table.rows) == 2 * len(links)
