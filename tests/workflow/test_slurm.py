"""The workflow through a real Slurm: scripts/local_slurm.sh starts a one-node controller on this machine
(apt-installing munge and Slurm when missing), the slurm-local profile submits every job with sbatch, and a
GPU request set per rule reaches the scheduler (two fake GPUs: character devices cloned from /dev/null).

Skipped with the reason when not root or when Slurm cannot be installed or started, unless
COMMRL_REQUIRE_SLURM=1 (CI), which turns those into failures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml
from snakemake_run import REPO, Workflow

SCRIPT = REPO / "scripts" / "local_slurm.sh"
REQUIRED = os.environ.get("COMMRL_REQUIRE_SLURM") == "1"

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"COMMRL_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def local_slurm():
    """The local controller, started for these tests (and stopped after) unless it already ran."""
    if os.geteuid() != 0:
        _unavailable("the local Slurm runs its daemons as root; run the tests as root")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        _unavailable("Slurm is not installed and there is no apt-get to install it")
    was_running = subprocess.run([SCRIPT, "status"], capture_output=True, timeout=60).returncode == 0
    start = subprocess.run([SCRIPT, "start"], capture_output=True, text=True, timeout=900)
    if start.returncode != 0:
        _unavailable(f"scripts/local_slurm.sh start failed:\n{(start.stdout + start.stderr)[-2000:]}")
    yield
    if not was_running:
        subprocess.run([SCRIPT, "stop"], capture_output=True, timeout=120)
        # A config left at the default path, naming a stopped controller, makes every later `scontrol`
        # (run by the slurm executor plugin when Snakemake starts) wait ~9 s for it.
        base = os.path.realpath(os.environ.get("LOCAL_SLURM_DIR", REPO / ".local-slurm"))
        left = "/etc/slurm/slurm.conf"
        assert not (os.path.islink(left) and os.readlink(left).startswith(base)), f"stop left {left} linked"


def _run_until_done(workflow: Workflow, args: list[str], timeout: float) -> tuple[int, str]:
    """snakemake with a deadline; on expiry SIGINT (SIGTERM only makes it wait) and cancel its Slurm jobs."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", *args],
        cwd=workflow.root,
        env=workflow.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        run = re.search(r"SLURM run ID: (\S+)", out)
        if run:
            subprocess.run(["scancel", "--name", run.group(1)], capture_output=True, timeout=30)
        pytest.fail(f"snakemake through Slurm did not finish in {timeout} s:\n{out[-3000:]}")
    return proc.returncode, out


SUBSET = REPO / "tests" / "fixtures" / "pipeline" / "slurm-subset.yaml"
SUBSET_RULES = {"init_store", "init_pair", "prepare_toy", "pretrain", "train_local", "eval_tiny", "report"}


def test_the_pipeline_subset_runs_through_slurm_with_its_gpu_requests(
    local_slurm, workflow: Workflow
) -> None:
    """data -> base policy -> training -> evaluation -> report, every job an sbatch job (the documented
    subset, tests/fixtures/pipeline/slurm-subset.yaml); the GPU requests of pretrain and train reach Slurm."""
    shutil.copy(SUBSET, workflow.root / "subset.yaml")
    args = ["--configfile", "subset.yaml", "--profile", "profiles/slurm-local"]
    returncode, out = _run_until_done(workflow, args, timeout=1200)
    assert returncode == 0, out[-4000:]
    assert (workflow.root / "results/report/report.md").is_file()
    summary = workflow.root / "results/runs/tiny/method/seed0/summary.json"
    assert '"ticks_trained": 4' in summary.read_text()
    assert (workflow.root / "results/eval/tiny/method/seed0/toy_greedy.json").is_file()

    submissions = re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/rule_(\w+)/", out)
    submitted = {rule: job for job, rule in submissions}
    assert set(submitted) == SUBSET_RULES, out[-3000:]
    for rule, job in submitted.items():
        shown = _scontrol_job(job)
        assert "JobState=COMPLETED" in shown, shown
        wants_gpu = rule in ("pretrain", "train_local")
        assert ("gres:gpu:1" in shown) == wants_gpu, (rule, shown)


def _scontrol_job(job_id: str) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    return shown.stdout + shown.stderr


PREEMPT_TICKS = 12
PREEMPT_SETUP = """
from commrl.cli.main import main
toy = ["--n-train", "64", "--n-val", "8", "--n-test", "8"]
assert main(["prepare", "--dataset", "toy", "--seed", "0", "--out", "results/data/toy", *toy]) == 0
assert main(["init-store", "--stamp", "results/.init/mlflow.done"]) == 0
assert main(["init-store", "--pair", "tiny", "--stamp", "results/.init/pairs/tiny.done"]) == 0
sweep = ["--config", "configs/sweep/preempt.yaml", "--study", "preempt"]
assert main(["sweep", "init", *sweep, "--out", "results/sweeps/tiny/preempt/init.json"]) == 0
"""


def _preempt_world(workflow: Workflow) -> str:
    """In the workflow's copy: a fast tiny pair (4 prompts x 4 samples, checkpoints every 3 ticks), a 2-trial
    sweep of 6-tick trials, a pipeline config of one 12-tick run, and their inputs made outside Slurm (toy
    data, an untrained small policy, the MLflow store, the study): only the signalled jobs run in Slurm."""
    pair = workflow.root / "configs" / "train" / "pair" / "tiny.yaml"
    tiny = yaml.safe_load(pair.read_text())
    tiny["data"]["val_limit"] = 8
    tiny["sampler"]["max_new_tokens"] = 8
    tiny["rl"].update(prompts_per_tick=4, group_size=4, micro_batch_size=16, val_every=4)
    tiny["checkpoint"] = {"every": 3}
    pair.write_text("# @package _global_\n" + yaml.safe_dump(tiny, sort_keys=False))
    sweep = yaml.safe_load((workflow.root / "configs" / "sweep" / "tiny.yaml").read_text())
    sweep.update(n_trials=2, n_workers=1, ticks=6, val_every=3, read_at=6, pruner={"name": "none"})
    sweep["storage"] = "sqlite:///results/optuna/preempt.db"
    (workflow.root / "configs" / "sweep" / "preempt.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
    job = {"threads": 1, "mem_mb": 2000, "runtime": 20}
    config = {
        "datasets": {"toy": {"seed": 0}},
        "pairs": {
            "tiny": {
                "driver": "local",
                "train_data": "toy",
                "pretrain": {"seed": 0},
                "conditions": ["method"],
                "seeds": [0],
                "ticks": {"method": PREEMPT_TICKS},
                "eval": {
                    "backend": "hf",
                    "benchmarks": {"toy_greedy": {"data": "results/data/toy/test.jsonl"}},
                },
                "sweep": {"config": "configs/sweep/preempt.yaml", "study": "preempt"},
            }
        },
        "resources": {k: dict(job) for k in ("init", "data", "pretrain", "train", "eval", "sweep", "report")},
    }
    name = workflow.write_config(config, "preempt.yaml")
    setup = subprocess.Popen(  # data, store and study there; the base policy meanwhile, here
        [sys.executable, "-c", PREEMPT_SETUP],
        cwd=workflow.root,
        env=workflow.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    from commrl.models.tiny import TinyModelShape, build_char_tokenizer, build_tiny_model, save_model_dir

    base = workflow.root / "results" / "models" / "tiny-base"
    tokenizer = build_char_tokenizer()
    save_model_dir(build_tiny_model(TinyModelShape(64, 2, 2, 1, 128), tokenizer, seed=0), tokenizer, base)
    (base / "base_accuracy.json").write_text(json.dumps({"accuracy": 0.0}))
    _, errors = setup.communicate(timeout=300)
    assert setup.returncode == 0, errors[-3000:]
    for made in base.iterdir():  # newer than the data, as pretrain would have made it
        os.utime(made)
    return name


def _our_jobs(run_id: str) -> list[tuple[str, str, str, str]]:
    """(job id, state, reason, comment) of this Snakemake run's Slurm jobs."""
    shown = subprocess.run(
        ["squeue", "-h", "--states=all", "--name", run_id, "-o", "%i|%T|%r|%k"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return [tuple(line.split("|", 3)) for line in shown.stdout.splitlines() if line.count("|") == 3]


def test_preempted_jobs_checkpoint_exit_75_are_requeued_and_finish_exactly(
    local_slurm, workflow: Workflow
) -> None:
    """Two sbatch jobs get a signal mid-run with `scancel --signal`: a training run SIGUSR1, a sweep worker
    SIGTERM in its first trial (its trial is a training run too: SIGTERM on the local driver alone is
    tests/rl/test_preemption.py). Each checkpoints after its tick, exits 75 and is requeued by
    workflow/scripts/preemptible.sh (no Snakemake retry); the rerun resumes: the run ends with exactly 12
    ticks, one MLflow value per tick, marked `preempted` and FINISHED, and the study with exactly its 2
    trials (the preempted one retried with the same params)."""
    from optuna import load_study
    from optuna.trial import TrialState

    from commrl import tracking
    from commrl.sweep.storage import retry_history

    config = _preempt_world(workflow)
    root = workflow.root
    runs = root / "results" / "runs" / "tiny" / "method"
    trials = root / "results" / "sweeps" / "tiny" / "preempt" / "trials"
    victims = {  # comment of the Slurm job -> (a file its trainer writes when it starts, the signal then)
        "rule_train_local_wildcards_tiny_method_0": (runs / "seed0" / "mlflow_run_id", "USR1"),
        "rule_sweep_worker_wildcards_tiny_preempt_0": (trials / "trial0000" / "mlflow_run_id", "TERM"),
    }
    targets = ["results/runs/tiny/method/seed0/summary.json", "results/sweeps/tiny/preempt/worker0.json"]
    log = root / "snakemake.out"
    args = [*targets, "--configfile", config, "--profile", "profiles/slurm-local"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "snakemake", *args, "--rerun-triggers", "mtime"],
            cwd=root,
            env=workflow.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    signalled: dict[str, str] = {}
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline:
        run_id = re.search(r"SLURM run ID: (\S+)", log.read_text())
        for job, state, reason, comment in _our_jobs(run_id.group(1)) if run_id else []:
            if comment in victims and comment not in signalled and state == "RUNNING":
                ready, sig = victims[comment]
                if ready.is_file():
                    subprocess.run(["scancel", f"--signal={sig}", job], check=True, timeout=30)
                    signalled[comment] = job
            if state == "PENDING" and reason == "BeginTime":  # a requeued job waits ~2 min: not here
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], timeout=30)
        time.sleep(0.3)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        if run_id:
            subprocess.run(["scancel", "--name", run_id.group(1)], capture_output=True, timeout=30)
    output = log.read_text()
    assert proc.returncode == 0, output[-4000:]
    assert set(signalled) == set(victims), (signalled, output[-3000:])
    assert "Trying to restart" not in output  # requeued by Slurm, no Snakemake retry used
    for job in signalled.values():
        shown = _scontrol_job(job)
        assert "JobState=COMPLETED" in shown and "Restarts=1" in shown, shown
    for name in ("train/tiny/method/seed0", "sweep/tiny/preempt/worker0"):  # Snakemake deleted the log at
        # the requeued start; the preempted attempt's copy is kept beside it
        log_file = root / "results" / "logs" / f"{name}.log"
        kept = list(log_file.parent.glob(f"{log_file.stem}.attempt-*.log"))
        assert len(kept) == 1, (name, sorted(p.name for p in log_file.parent.iterdir()))
        first = kept[0].read_text()
        assert first.startswith("preemptible: start ") and "requeued" in first, first[-2000:]
        assert (
            log_file.read_text().startswith("preemptible: start ") and "requeued" not in log_file.read_text()
        )

    client = tracking.client(f"sqlite:///{root / 'results' / 'mlflow.db'}")
    summary = json.loads((runs / "seed0" / "summary.json").read_text())
    assert summary["ticks_trained"] == summary["ticks_asked"] == PREEMPT_TICKS
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["preempted_by"] == "SIGUSR1"
    assert 1 <= int(run.data.tags["preempted"]) < PREEMPT_TICKS
    for key in ("score/mean", "actor/kl_loss", "comm/bytes_cumulative"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert sorted(steps) == list(range(1, PREEMPT_TICKS + 1)), (key, steps)

    study = load_study(study_name="preempt", storage=f"sqlite:///{root / 'results/optuna/preempt.db'}")
    done = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    failed = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert len(done) == 2 and len(study.get_trials()) == 3, [t.state for t in study.get_trials()]
    assert len(failed) == 1 and failed[0].user_attrs["note"].startswith("preempted by SIGTERM after tick")
    retry = next(t for t in done if retry_history(t) == [failed[0].number])
    assert retry.params == failed[0].params
    trial_run = client.get_run(retry.user_attrs["mlflow_run_id"])  # the preempted trial's run, resumed
    assert (
        trial_run.data.tags["preempted_by"] == "SIGTERM" and trial_run.data.tags["optuna.state"] == "COMPLETE"
    )
    steps = [m.step for m in client.get_metric_history(trial_run.info.run_id, "score/mean")]
    assert sorted(steps) == list(range(1, 7))
    assert json.loads((root / "results/sweeps/tiny/preempt/worker0.json").read_text())["study_complete"]
