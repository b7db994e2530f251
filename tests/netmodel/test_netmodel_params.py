"""Bad link, layout, compute and config parameters are refused naming the field (library) or the option
(``commrl netmodel``, exit 2); the named interconnects carry their sources; the command's table."""

from __future__ import annotations

import math
import re

import pytest

from commrl.cli.main import main
from commrl.netmodel import INTERCONNECTS, Compute, Layout, Link, NetModelError, load_config, named_link


@pytest.mark.parametrize("bandwidth", [0.0, -1.0, math.nan, math.inf])
def test_bandwidth_must_be_positive_and_finite(bandwidth):
    with pytest.raises(NetModelError, match=r"bandwidth_gbps=.* is invalid.*> 0 Gbit/s") as err:
        Link("mine", bandwidth, 5.0)
    assert err.value.field == "bandwidth_gbps"


def test_latency_layout_and_compute_are_checked():
    with pytest.raises(NetModelError, match=r"latency_us=-1.0 is invalid") as err:
        Link("mine", 10.0, -1.0)
    assert err.value.field == "latency_us"
    with pytest.raises(NetModelError, match=r"layout.stages=0 is invalid: must be an integer >= 1"):
        Layout(stages=0, dp=1, points=4)
    with pytest.raises(NetModelError, match=r"layout.stages=6 is invalid.*S <= 5"):
        Layout(stages=6, dp=1, points=4)
    with pytest.raises(NetModelError, match=r"layout.dp=0"):
        Layout(stages=2, dp=0, points=4)
    with pytest.raises(NetModelError, match=r"layout.collective='tree' is invalid: one of allreduce, rs_ag"):
        Layout(stages=2, dp=2, points=4, collective="tree")
    with pytest.raises(NetModelError, match=r"layout.micro_batches=0 is invalid: must be an integer >= 1"):
        Layout(stages=2, dp=2, points=4, micro_batches=0)
    with pytest.raises(NetModelError, match=r"compute.train_s=-3.0 is invalid"):
        Compute(-3.0)


def test_unknown_interconnect_names_the_known_ones():
    with pytest.raises(NetModelError, match=r"interconnect='40GbE' is invalid.*known: 1GbE, 10GbE") as err:
        named_link("40GbE")
    assert err.value.field == "interconnect"
    assert named_link("ib100") is INTERCONNECTS["IB-EDR"] and named_link("NVLINK") is INTERCONNECTS["NVLink4"]


def test_named_interconnects_have_sources():
    assert set(INTERCONNECTS) == {"1GbE", "10GbE", "IB-EDR", "IB-NDR", "NVLink4"}
    assert [link.bandwidth_gbps for link in INTERCONNECTS.values()] == [1.0, 10.0, 100.0, 400.0, 3600.0]
    assert all(len(link.source) > 30 for link in INTERCONNECTS.values())
    assert "IEEE 802.3ab" in INTERCONNECTS["1GbE"].source and "900 GB/s" in INTERCONNECTS["NVLink4"].source


def test_the_repository_configs_load():
    from commrl.report.network import NetworkOptions

    configs = {c.pair: c for c in NetworkOptions.from_dir().configs}
    assert set(configs) == {"A", "tiny"}
    assert configs["tiny"].source == "runs" and "CPU times" in configs["tiny"].compute_note
    assert configs["A"].source == "analytic" and configs["A"].compute.train_s is None
    assert configs["A"].interconnects == tuple(INTERCONNECTS)
    assert configs["A"].analytic.param_bytes == 2 and configs["A"].param_scale == 0.5  # verl's bf16 gather
    assert configs["tiny"].element_bytes == {"grads": 4, "params": 4} and configs["tiny"].param_scale == 1.0


def test_config_errors_name_the_file_and_key(tmp_path):
    bad = tmp_path / "pair_x.yaml"
    bad.write_text(
        "pair: x\nbytes: runs\nlayout: {stages: 2, dp: 1, points: 4}\ncompute_note: x\nlinks: []\n"
    )
    with pytest.raises(NetModelError, match=r"pair_x.yaml: unknown key\(s\) links"):
        load_config(bad)
    bad.write_text("pair: x\nbytes: runs\nlayout: {stages: 2, dp: 1}\ncompute_note: x\n")
    with pytest.raises(NetModelError, match=r"pair_x.yaml: layout.points is missing"):
        load_config(bad)
    bad.write_text("pair: x\nbytes: runs\nlayout: {stages: 2, dp: 1, points: 4}\ncompute_note: x\n")
    with pytest.raises(NetModelError, match=r"pair_x.yaml: passes is missing"):
        load_config(bad)
    bad.write_text(
        "pair: x\nbytes: runs\nlayout: {stages: 2, dp: 1, points: 4}\ncompute_note: x\n"
        "passes: {fast: 3, fire: 0}\n"
    )
    with pytest.raises(NetModelError, match=r"passes.fire=0 must be an integer >= 1"):
        load_config(bad)
    bad.write_text("pair: x\nbytes: disk\nlayout: {}\ncompute_note: x\n")
    with pytest.raises(NetModelError, match=r"bytes='disk' is invalid: one of runs, analytic"):
        load_config(bad)


RUNS_HEAD = (
    "pair: x\nbytes: runs\nlayout: {stages: 2, dp: 1, points: 4}\ncompute_note: x\n"
    "passes: {fast: 2, fire: 3}\n"
)


@pytest.mark.parametrize(
    ("element_bytes", "field", "message"),
    [
        (None, "element_bytes", "element_bytes is missing: {grads: n, params: n}"),
        ("{grads: 4}", "element_bytes", "element_bytes must have the keys grads and params, got ['grads']"),
        (
            "{grads: 4, params: 3}",
            "element_bytes.params",
            "element_bytes.params=3 is invalid: one of 1, 2, 4, 8",
        ),
        (
            "{grads: 0, params: 2}",
            "element_bytes.grads",
            "element_bytes.grads=0 is invalid: one of 1, 2, 4, 8",
        ),
        ("{grads: 4, params: bf16}", "element_bytes.params", "element_bytes.params='bf16' is invalid"),
    ],
)
def test_runs_element_bytes_are_required_and_checked(element_bytes, field, message, tmp_path):
    """A ``bytes: runs`` config says the element sizes of the gradients its runs' ledger counts and of the
    parameters FSDP all-gathers; a bad one names the key, the sizes allowed and what it is."""
    path = tmp_path / "pair_x.yaml"
    path.write_text(RUNS_HEAD + (f"element_bytes: {element_bytes}\n" if element_bytes else ""))
    with pytest.raises(NetModelError, match=re.escape(f"pair_x.yaml: {message}")) as err:
        load_config(path)
    assert err.value.field == field
    path.write_text(RUNS_HEAD + "element_bytes: {grads: 4, params: 2}\n")
    assert load_config(path).param_scale == 0.5


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", "analytic.param_bytes is missing: the element size in bytes of the parameters FSDP (rs_ag) "),
        ("  param_bytes: 3", "analytic.param_bytes=3 is invalid: one of 1, 2, 4, 8, the element size"),
        ("  param_bytes: 0", "analytic.param_bytes=0 is invalid: one of 1, 2, 4, 8"),
        ("  param_bytes: 2.0", "analytic.param_bytes=2.0 is invalid: one of 1, 2, 4, 8"),
        ("  param_bytes: true", "analytic.param_bytes=True is invalid: one of 1, 2, 4, 8"),
        ("  param_bytes: bf16", "analytic.param_bytes='bf16' is invalid: one of 1, 2, 4, 8"),
    ],
)
def test_param_bytes_is_required_and_checked_naming_the_key_and_the_fix(line, message, tmp_path, capsys):
    """``analytic.param_bytes``, the element size at which FSDP all-gathers the parameters, has no default
    (pair_A.yaml sets verl's bf16); a missing or impossible one fails naming the key, the file and the
    fix (2 for bf16, 4 for fp32), from the library and from the command (exit 2)."""
    path = pair_a_with(tmp_path, "  param_bytes:", line)
    with pytest.raises(NetModelError, match=re.escape(f"pair_x.yaml: {message}")) as err:
        load_config(path)
    assert err.value.field == "analytic.param_bytes"
    assert "2 for bf16 (verl's FSDP default), 4 for fp32" in str(err.value)
    uri = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["netmodel", "--pair", "A", "--config", str(path), "--tracking-uri", uri]) == 2
    assert f"pair_x.yaml: {message}" in capsys.readouterr().err


def test_element_bytes_belongs_to_runs_configs(tmp_path):
    path = pair_a_with(tmp_path, "compute_note:", "element_bytes: {grads: 4, params: 2}\ncompute_note: >-")
    with pytest.raises(NetModelError, match=r"element_bytes applies to bytes: runs only") as err:
        load_config(path)
    assert err.value.field == "element_bytes"


def pair_a_with(tmp_path, old: str, new: str):
    """configs/netmodel/pair_A.yaml with the line starting ``old`` replaced by ``new``, in ``tmp_path``."""
    from commrl.netmodel.config import config_dir

    lines = (config_dir() / "pair_A.yaml").read_text().splitlines()
    hits = [i for i, line in enumerate(lines) if line.startswith(old)]
    assert len(hits) == 1, old
    lines[hits[0]] = new
    path = tmp_path / "pair_x.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("  updates_per_tick: 0", "analytic.updates_per_tick=0 must be an integer >= 1"),
        ("  updates_per_tick: 2.5", "analytic.updates_per_tick=2.5 must be an integer >= 1"),
        ("  updates_per_tick: -2", "analytic.updates_per_tick=-2 must be an integer >= 1"),
        ("  min_compression_rate: -1", "analytic.min_compression_rate=-1 must be a finite number > 0"),
        ("  min_compression_rate: 0", "analytic.min_compression_rate=0 must be a finite number > 0"),
        ("  min_compression_rate: .nan", "analytic.min_compression_rate=nan must be a finite number > 0"),
    ],
)
def test_analytic_values_out_of_range_are_refused_naming_the_key_and_file(line, message, tmp_path, capsys):
    key = line.split(":")[0]
    path = pair_a_with(tmp_path, key + ":", line)
    with pytest.raises(NetModelError, match=rf"pair_x.yaml: {message}") as err:
        load_config(path)
    assert err.value.field == f"analytic.{key.strip()}"
    uri = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["netmodel", "--pair", "A", "--config", str(path), "--tracking-uri", uri]) == 2
    assert f"pair_x.yaml: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("  low_gbps: 0", "sweep.low_gbps=0 is invalid: a finite bandwidth > 0 Gbit/s"),
        ("  high_gbps: .inf", "sweep.high_gbps=inf is invalid: a finite bandwidth > 0 Gbit/s"),
        ("  latency_us: -1", "sweep.latency_us=-1 is invalid: a finite latency >= 0"),
        ('  tolerance: "x"', "sweep.tolerance='x' must be in [0, 1)"),
    ],
)
def test_sweep_values_are_refused_naming_the_sweeps_key(line, message, tmp_path, capsys):
    path = pair_a_with(tmp_path, line.split(":")[0] + ":", line)
    uri = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["netmodel", "--pair", "A", "--config", str(path), "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert f"pair_x.yaml: {message}" in err
    assert "--bandwidth-gbps" not in err and "--latency-us" not in err  # the config's key, not an option


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bandwidth-gbps", "0", "--latency-us", "5"], "--bandwidth-gbps: bandwidth_gbps=0.0 is invalid"),
        (["--bandwidth-gbps", "-2", "--latency-us", "5"], "--bandwidth-gbps: bandwidth_gbps=-2.0 is invalid"),
        (["--bandwidth-gbps", "25"], "--latency-us: latency_us is missing"),
        (["--link", "40GbE"], "--link: interconnect='40GbE' is invalid"),
        (["--stages", "0"], "--stages: layout.stages=0 is invalid"),
        (["--stages", "30"], "--stages: layout.stages=30 is invalid"),
        (["--dp", "-1"], "--dp: layout.dp=-1 is invalid"),
        (["--micro-batches", "0"], "--micro-batches: layout.micro_batches=0 is invalid"),
        (["--compute-s", "-5"], "--compute-s: compute.train_s=-5.0 is invalid"),
        (["--target-fraction", "1.5"], "--target-fraction: target_fraction=1.5 is invalid"),
    ],
)
def test_the_command_exits_2_naming_the_option(argv, message, capsys, tmp_path):
    uri = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["netmodel", "--pair", "A", "--tracking-uri", uri, *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()  # no empty store created


def test_the_command_refuses_compute_for_a_pair_measured_from_its_runs(capsys):
    assert main(["netmodel", "--pair", "tiny", "--compute-s", "4"]) == 2
    assert "--compute-s: compute applies to analytic pairs" in capsys.readouterr().err
    assert main(["netmodel", "--pair", "nope"]) == 2
    assert "--pair: pair 'nope' has no" in capsys.readouterr().err


def test_the_command_prints_pair_a_at_a_link_of_ones_own(capsys, tmp_path):
    """Pair A from the analytic ledger at 25 Gbit/s, 5 us, 4 stages x 8 replicas, 86 micro-batches, 400 s
    of compute: dense's 4 traversals of 5.772e12 bytes, (86 + 2) / 86 x 5.772e12 / (28 * 8) bytes and
    4 x 88 messages per boundary (8.440 s), plus the reduce-scatter over 8 ranks of the last stage's
    2.244e9 gradient bytes (fp32; 7 layers, the final norm and the tied head: 0.628 s) and the all-gather
    of its 1.122e9 parameter bytes (bf16, verl's FSDP param_dtype: 0.314 s), reduced and gathered once
    (``--gathers 1 --reduces 1``): 9.382 s; no store, so no time to target. As verl's FSDP runs by default,
    gathering once per traversal and micro-batch (4 x 86) and reduce-scattering once per micro-batch (86):
    343 more gathers and 85 more reduce-scatters."""
    uri = f"sqlite:///{tmp_path / 'none.db'}"
    argv = ["netmodel", "--pair", "A", "--tracking-uri", uri, "--compute-s", "400"]
    argv += ["--bandwidth-gbps", "25", "--latency-us", "5", "--stages", "4", "--dp", "8"]

    def dense_row(extra: list[str]) -> list[str]:
        assert main(argv + extra) == 0
        out = capsys.readouterr().out
        assert "crossover, no overlap:" in out and "given on the command line" in out
        assert "no time to target" in out
        row = next(line for line in out.splitlines() if line.startswith("custom") and "no overlap" in line)
        return [c.strip() for c in row.split("|")]

    cells = dense_row(["--gathers", "1", "--reduces", "1"])
    assert cells[:4] == ["custom", "25", "5", "no overlap"]
    assert float(cells[4]) == pytest.approx(9.3824, abs=1e-3)  # dense comm s
    assert float(cells[6]) == pytest.approx(409.3824, abs=0.01)  # dense tick, no overlap
    gather = 7 * 5e-6 + 7 / 8 * 2 * 560_960_000 / 3.125e9
    reduce = 7 * 5e-6 + 7 / 8 * 4 * 560_960_000 / 3.125e9
    assert float(dense_row([])[4]) == pytest.approx(9.3824 + 343 * gather + 85 * reduce, abs=0.01)


def test_a_new_data_parallelism_without_micro_batches_is_noted(capsys, tmp_path):
    """Pair A's 86 micro-batches were worked out for dp 8 at the token budget: at --dp 16 a replica holds
    half the tokens, and the gathers and reduce-scatters counted from the 86 would be twice too many."""
    argv = ["netmodel", "--pair", "A", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}", "--dp", "16"]
    assert main(argv) == 0
    assert "note: with --dp the layout keeps the config's 86 micro-batches" in capsys.readouterr().err
    assert main([*argv, "--micro-batches", "43"]) == 0
    assert "micro-batches per pass and replica (its" not in capsys.readouterr().err
