"""``commrl sweep init|worker|summary`` with exactly the arguments of workflow/rules/sweep.smk."""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

from sweep_fakes import FakeDriver

from commrl.cli.main import main
from commrl.sweep.config import load_sweep_config
from commrl.sweep.worker import run_worker

RULES = Path(__file__).resolve().parents[2] / "workflow" / "rules" / "sweep.smk"


def rule_commands() -> dict[str, str]:
    """The shell command of each sweep rule, as Snakemake would join its string literals."""
    text = RULES.read_text()
    commands = {}
    for name, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", text, flags=re.S | re.M):
        shell = re.search(r"shell:\n((?:\s+\".*\"\n?)+)", body)
        literals = re.findall(r"\"(?:[^\"\\]|\\.)*\"", shell.group(1))
        commands[name] = "".join(ast.literal_eval(s) for s in literals)
    return commands


def argv(command: str, **values: str) -> list[str]:
    """The command's arguments after ``commrl``, placeholders filled, the log redirection dropped, and the
    preemption wrapper (workflow/scripts/preemptible.sh, tested through Slurm in tests/workflow) left out."""
    command = command.split(" > {log}")[0].removeprefix("exec {params.preemptible} {log} ")
    for key, value in values.items():
        command = command.replace("{" + key + "}", value)
    assert "{" not in command, command
    words = shlex.split(command)
    assert words[0] == "commrl"
    return words[1:]


def test_the_rules_commands_run(env, tmp_path, sweep_dict, write_config):
    commands = rule_commands()
    assert set(commands) == {"sweep_init", "sweep_worker", "sweep_summary"}
    assert commands["sweep_worker"].startswith("exec {params.preemptible} {log} commrl sweep worker")
    sweep_dict.update(n_trials=2)
    config = str(write_config(sweep_dict))
    study_dir = tmp_path / "results" / "sweeps" / "tiny" / "tiny-method"
    common = {"input.config": config, "wildcards.study": "tiny-method"}

    init_out = study_dir / "init.json"
    assert main(argv(commands["sweep_init"], **common, output=str(init_out))) == 0
    assert json.loads(init_out.read_text())["study"] == "tiny-method"

    run_worker(load_sweep_config(config), "tiny-method", 0, driver=FakeDriver(6, 2))  # the trials, fast
    worker_out = study_dir / "worker1.json"
    worker = argv(commands["sweep_worker"], **common, output=str(worker_out), **{"wildcards.worker": "1"})
    assert main(worker) == 0
    record = json.loads(worker_out.read_text())
    assert record["worker"] == 1 and record["trials"] == [] and record["study_complete"]

    summary = study_dir / "summary"
    assert main(argv(commands["sweep_summary"], **common, output=str(summary))) == 0
    assert json.loads((summary / "best_params.json").read_text())["finished"] == 2


def test_help_lists_the_three_steps(capsys):
    try:
        main(["sweep", "--help"])
    except SystemExit as done:
        assert done.code == 0
    out = capsys.readouterr().out
    assert "init" in out and "worker" in out and "summary" in out
