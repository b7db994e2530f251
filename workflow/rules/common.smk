"""Config access, run ids and path helpers for workflow/rules/*.smk; naming only, no pipeline logic.

Every output lives under results/; a training run is (pair, condition, seed) and lives in
results/runs/<pair>/<condition>/seed<seed>/.
"""

import functools
import glob
import os
import re
import shlex
import signal
import warnings
from pathlib import Path

import jsonschema
import yaml
from commrl.config_tree import DRIVER_TREES, condition_dir, known_conditions, tree_dir
from commrl.errors import ConfigError
from commrl.eval.benchmarks import BENCHMARKS
from commrl.sweep.config import load_sweep_config
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

# The files `commrl prepare --dataset <name>` writes into results/data/<name>/ (besides manifest.json).
DATASET_FILES = {
    "toy": ["train.parquet", "validation.parquet", "test.parquet", "validation.jsonl", "test.jsonl"],
    "math": ["train.parquet"],
    "math500": ["test.parquet", "test.jsonl"],
    "deepscaler": ["train.parquet"],
}
SCHEMAS = Path(workflow.basedir) / "workflow" / "schemas"
CONDITIONS = Path(workflow.basedir) / "configs" / "condition"  # one file per condition, read by both drivers
MLFLOW_STAMP = "results/.init/mlflow.done"  # the MLflow store, created (migrated) once: init_store
# The conda environment of each kind of job, per driver (envs/; used with --sdm conda only).
ENVS = {"cpu": "../../envs/cpu.yaml", "train": "../../envs/train-gpu.yaml", "eval": "../../envs/eval-gpu.yaml"}

# Preemption (README, "Preemption and time limits"). Slurm's warning (`--signal=USR1@<lead>` in the profile's
# slurm_extra, or `scancel --signal=USR1`) reaches every process of the job step: the job's own Snakemake,
# the rule's shell and commrl. Snakemake and bash die of SIGUSR1 by default, so every Snakemake reading this
# file ignores it; an ignored signal is inherited, and commrl installs its own handler.
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
# A closed terminal sends SIGHUP, of which Snakemake dies at once, leaving its lock (the next run refuses to
# start until --unlock); its own SIGTERM handler stops it gracefully: the running jobs end (a training job
# checkpoints on the same SIGHUP and exits 75) and the lock is released, so the same command resumes.
signal.signal(signal.SIGHUP, lambda signum, frame: os.kill(os.getpid(), signal.SIGTERM))
PREEMPTIBLE = Path(workflow.basedir) / "workflow" / "scripts" / "preemptible.sh"  # requeues on exit 75
SIGNAL_LEAD = re.compile(r"--signal[= ](B:|R:)?(?:SIG)?(?:USR1|10)@(\d+)")
_lead_warned = set()
# signal_lead reads a job's resources in a params function; Snakemake then evaluates the input-size based
# ones inside its own event loop, falls back to <TBD> for them (rules.py, NestedCoroutineError, as in any
# dry-run) and Python reports the coroutine it never awaited: harmless.
warnings.filterwarnings("ignore", "coroutine 'InputFiles._predicated_size_files", RuntimeWarning)

wildcard_constraints:
    pair=r"[A-Za-z0-9][A-Za-z0-9_-]*",
    condition=r"[a-z][a-z_]*",
    seed=r"\d+",
    benchmark=r"[A-Za-z0-9][A-Za-z0-9_-]*",
    study=r"[A-Za-z0-9][A-Za-z0-9_-]*",
    worker=r"\d+",


def pair_cfg(pair):
    """The config of one pair; a clear error for a pair the config does not name."""
    try:
        return config["pairs"][pair]
    except KeyError:
        known = ", ".join(config["pairs"])
        raise WorkflowError(
            f"pair {pair!r} is not in the pipeline config's `pairs` (known: {known}); add it there or pass "
            "the config that has it (--configfile configs/pipeline/paper.yaml)"
        ) from None


def pairs_with(driver):
    return [p for p, c in config["pairs"].items() if c["driver"] == driver]


def one_of(names):
    """A wildcard constraint matching exactly these names (nothing when the list is empty)."""
    return "|".join(re.escape(n) for n in names) or r"(?!)"


def data_dir(name):
    return f"results/data/{name}"


def data_files(name):
    return [f"{data_dir(name)}/{f}" for f in [*DATASET_FILES[name], "manifest.json"]]


def excluded(name):
    """The test split whose problems `commrl prepare` removes from data set `name` (none or one)."""
    other = config["datasets"].get(name, {}).get("exclude")
    return [f"{data_dir(other)}/test.parquet"] if other else []


def prepare_options(name):
    """`commrl prepare` flags of data set `name`: the toy generator's seed, else the source to read and
    the test split whose problems to remove (the rule's input `exclude`)."""
    cfg = config["datasets"][name]
    if name == "toy":
        return f"--seed {cfg['seed']}"
    return " ".join([f"--source {shlex.quote(cfg['source'])}", *(f"--exclude {f}" for f in excluded(name))])


def model_dir(pair):
    return f"results/models/{pair}-base"


def run_dir(pair, condition, seed):
    return f"results/runs/{pair}/{condition}/seed{seed}"


def sweep_dir(pair):
    return f"results/sweeps/{pair}/{pair_cfg(pair)['sweep']['study']}"


def pair_stamp(pair):
    """The stamp of experiment commrl/<pair> in the MLflow store (init_pair): what every job that logs runs
    of `pair` takes, so that a pair added to (or removed from) the config leaves the other pairs' jobs alone."""
    return f"results/.init/pairs/{pair}.done"


def train_inputs(pair):
    """What a training run (or a sweep trial) of `pair` reads: its experiment, its data, its base model."""
    cfg = pair_cfg(pair)
    inputs = {"store": pair_stamp(pair), "train": f"{data_dir(cfg['train_data'])}/train.parquet"}
    if cfg["driver"] == "local":
        inputs["model"] = f"{model_dir(pair)}/model.safetensors"
    else:
        inputs["val"] = f"{data_dir(cfg['val_data'])}/test.parquet"
    return inputs


def workdir_path(path):
    """`path` relative to the working directory when it lies under it (as the rules name files), else as is."""
    path, here = Path(path), Path.cwd().resolve()
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


def run_configs(pair, *conditions):
    """The config files a training run of `pair` composes through Hydra, as inputs of its job: its driver's
    tree (`commrl train`: configs/train/, `commrl verl-train`: configs/verl/, or $COMMRL_<TREE>_CONFIGS as
    the drivers find it; commrl.config_tree) with its config.yaml and pair/<pair>.yaml, and each condition's
    file of the condition group beside it (configs/condition/<condition>.yaml). A change to any of them
    plans the run again."""
    tree = tree_dir(DRIVER_TREES[pair_cfg(pair)["driver"]])
    files = [tree / "config.yaml", tree / "pair" / f"{pair}.yaml"]
    files += [condition_dir(tree) / f"{condition}.yaml" for condition in conditions]
    return [workdir_path(f) for f in files]


def trial_configs(sweep):
    """`run_configs` of the trials of a sweep or study file: its pair's, with its condition and baseline."""
    return run_configs(sweep["pair"], sweep["condition"], *([sweep["baseline"]] if "baseline" in sweep else []))


def pretrain_inputs(pair):
    """What `commrl pretrain` reads for `pair`: its training data, and the shipped base if it has one."""
    cfg = pair_cfg(pair)
    inputs = {"data": data_files(cfg["train_data"])}
    if "shipped" in cfg["pretrain"]:
        shipped = cfg["pretrain"]["shipped"]
        inputs["shipped"] = [f"{shipped}/SHIPPED.json", f"{shipped}/model.safetensors"]
    return inputs


def pretrain_options(pair):
    """`commrl pretrain` flags for the optional knobs of pairs.<pair>.pretrain."""
    cfg = pair_cfg(pair)["pretrain"]
    flags = {"max_steps": "--max-steps", "target_acc": "--target-acc", "max_acc": "--max-acc"}
    options = [f"{flag} {cfg[key]}" for key, flag in flags.items() if key in cfg]
    if "shipped" in cfg:
        options.append(f"--shipped {shlex.quote(cfg['shipped'])}")
    if cfg.get("window_check") is False:
        options.append("--no-window-check")
    return " ".join(options)


def ticks_override(pair, condition):
    """The driver override asking for this condition's ticks, or nothing (the driver config decides).

    The local driver reads such a run at its last tick; the verl driver keeps the pair's read point.
    """
    cfg = pair_cfg(pair)
    ticks = cfg["ticks"].get(condition)
    if not ticks:
        return ""
    if cfg["driver"] == "local":
        return f"rl.ticks={ticks} rl.read_at={ticks}"
    return f"ticks={ticks}"


def eval_data(pair, benchmark):
    return pair_cfg(pair)["eval"]["benchmarks"].get(benchmark, {}).get("data")


def eval_per_checkpoint(pair):
    """Whether one evaluation job of `pair` runs all its benchmarks on a checkpoint (`eval.job_per`)."""
    return pair_cfg(pair)["eval"]["job_per"] == "checkpoint"


def eval_outputs(pair):
    """The summaries one evaluation job of `pair` writes: every benchmark's, or its {benchmark}'s."""
    run = f"results/eval/{pair}/{{condition}}/seed{{seed}}"
    if eval_per_checkpoint(pair):
        return [f"{run}/{name}.json" for name in pair_cfg(pair)["eval"]["benchmarks"]]
    return f"{run}/{{benchmark}}.json"


def eval_benchmarks(pair, wildcards):
    """The benchmarks of one evaluation job."""
    if eval_per_checkpoint(pair):
        return list(pair_cfg(pair)["eval"]["benchmarks"])
    return [wildcards.benchmark]


def eval_inputs(pair):
    """What an evaluation reads: the run's summary.json (it names the model at the read tick, the one
    `commrl eval --summary` evaluates) and its benchmarks' data where the pipeline makes it."""

    def inputs(wildcards):
        found = {"summary": f"{run_dir(pair, wildcards.condition, wildcards.seed)}/summary.json"}
        data = {eval_data(pair, name) for name in eval_benchmarks(pair, wildcards)}
        made = sorted(path for path in data if path and path.startswith("results/"))
        return {**found, **{f"data{i}": path for i, path in enumerate(made)}}

    return inputs


def eval_options(pair):
    """`commrl eval`'s benchmarks, where each writes, and `--data NAME=PATH` where the config names a
    benchmark's data (else the registry's source)."""

    def options(wildcards):
        names = eval_benchmarks(pair, wildcards)
        run = f"results/eval/{pair}/{wildcards.condition}/seed{wildcards.seed}"
        words = [f"--benchmark {name}" for name in names]
        words += [f"--data {name}={eval_data(pair, name)}" for name in names if eval_data(pair, name)]
        return " ".join(words + [f"--out-dir {run}"])

    return options


@functools.cache
def sweep_config(pair):
    """The sweep file of `pair`: the keys the workflow reads (workflow/schemas/sweep.schema.yaml), its `pair`
    this pair, its driver and conditions the pair's."""
    field, path = f"pairs.{pair}.sweep.config", pair_cfg(pair)["sweep"]["config"]
    try:
        with open(path) as f:
            sweep = yaml.safe_load(f)
    except OSError as e:
        raise config_error(field, f"cannot read {path!r} ({e.strerror}); fix the path") from None
    checked(sweep, "sweep.schema.yaml", path, f" (the sweep config of {field} in {config_files()})")
    if sweep["pair"] != pair:
        raise config_error(
            field,
            f"{path} sweeps pair {sweep['pair']!r} (its `pair`), not {pair!r}; name a file with pair: {pair}",
        )
    check_sweep_runs(sweep, path)
    return sweep


def sweep_workers(pair):
    return range(sweep_config(pair)["n_workers"])


def study_file(study):
    return f"configs/sweep/{study}.yaml"


@functools.cache
def study_config(study):
    """The grid config of a study, checked for the keys the workflow reads; its pair must be the config's."""
    path = study_file(study)
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise WorkflowError(
            f"results/studies/{study}: cannot read {path} ({e.strerror}); a study is configs/sweep/<study>.yaml"
        ) from None
    checked(raw, "sweep.schema.yaml", path, f" (the study of results/studies/{study})")
    if (raw.get("sampler") or {}).get("name") != "grid":
        raise WorkflowError(
            f"results/studies/{study}: {path} is not a grid study (set sampler: {{name: grid}} and a grid); "
            "a search runs as a pair's sweep (pairs.<pair>.sweep, results/sweeps/)"
        )
    pair_cfg(raw["pair"])  # a pair of the pipeline config: its data and base model feed the trials
    check_sweep_runs(raw, path)
    return raw


def check_sweep_runs(sweep, path):
    """A sweep file's trials can run: the whole file passes `commrl sweep`'s own checks (every key, range
    and knob; commrl.sweep.config), its driver is its pair's, which runs its condition (and baseline)."""
    try:
        load_sweep_config(path)
    except ConfigError as e:
        raise WorkflowError(str(e)) from None
    pair = sweep["pair"]
    driver = pair_cfg(pair)["driver"]
    if sweep["driver"] != driver:
        raise WorkflowError(
            f"{path}: driver: {sweep['driver']!r} is not the driver of pair {pair!r}, {driver!r} "
            f"(pairs.{pair}.driver in {config_files()}); set driver: {driver}"
        )
    for key in ("condition", "baseline"):
        problem = condition_problem(sweep[key], driver) if key in sweep else None
        if problem:
            raise WorkflowError(f"{path}: {key}: {problem}")


def study_pair(study):
    return study_config(study)["pair"]


def study_workers(study):
    return range(study_config(study)["n_workers"])


def env(kind, driver="local"):
    """The conda env file of a kind of job: the CPU stack for the local driver, the GPU stacks for verl."""
    return ENVS["cpu"] if driver == "local" else ENVS[kind]


def pair_env(kind):
    """`env` as a function of the job's pair, for rules shared by both drivers."""
    return lambda wildcards: env(kind, pair_cfg(wildcards.pair)["driver"])


def threads_of(kind):
    return config["resources"][kind]["threads"]


RESUMABLE_KINDS = ("train", "sweep")  # a retry resumes from the job's checkpoints


def resources_of(kind):
    """Scheduler resources of a kind of job.

    A GPU job is one task on one node (`nodes: 1`, `tasks_per_gpu: 0`): the Slurm plugin's default of one
    task per GPU would ask for `threads` CPUs per GPU and let Slurm spread the job over nodes. Memory and
    time grow with the attempt (profile `retries`), except for the resumable kinds: their retry resumes from
    the last checkpoint, and their first request is a whole node, which a doubled one would exceed.
    """
    res = dict(config["resources"][kind])
    res.pop("threads")
    res.pop("checkpoint_s", None)  # read by signal_lead
    if res.get("gpu"):
        res.update(nodes=1, tasks_per_gpu=0)
    mem_mb, runtime = res.pop("mem_mb"), res.pop("runtime")
    grows = kind not in RESUMABLE_KINDS
    res["mem_mb"] = lambda wildcards, attempt: mem_mb * (attempt if grows else 1)
    res["runtime"] = lambda wildcards, attempt: runtime * (attempt if grows else 1)
    return res


def signal_lead(kind, resources):
    """The warning lead in seconds of a job's `--signal=USR1@<lead>` (its slurm_extra; 0: none), for
    workflow/scripts/preemptible.sh. Warns once per kind when the lead is shorter than
    resources.<kind>.checkpoint_s (the rest of a tick plus a checkpoint), when it is not shorter than the
    job's time limit (the warning would come at its start), or when `B:` sends the warning to the batch
    shell only: the executor plugin's job script neither traps nor forwards it and dies of it."""
    match = SIGNAL_LEAD.search(str(resources.get("slurm_extra", "") or ""))
    if not match:
        return 0
    lead, need = int(match.group(2)), config["resources"][kind].get("checkpoint_s")
    limit = 60 * int(resources.get("runtime", 0) or 0)
    if kind not in _lead_warned:
        if match.group(1) == "B:":
            _lead_warned.add(kind)
            logger.warning(
                f"{kind} jobs ask for --signal=B:USR1@{lead}: B: signals the batch shell only, which dies of it "
                f"and ends the job; use --signal=USR1@{lead} (every process of the job step)"
            )
        elif limit and lead >= limit:
            _lead_warned.add(kind)
            logger.warning(
                f"{kind} jobs get their warning signal {lead} s before the time limit, but their limit is "
                f"{limit} s (resources.{kind}.runtime): the warning comes at the start, and every requeue "
                f"trains about a tick before it stops again; lower the lead or raise the runtime"
            )
        elif need and lead < need:
            _lead_warned.add(kind)
            logger.warning(
                f"{kind} jobs get their warning signal {lead} s before the time limit, but "
                f"resources.{kind}.checkpoint_s = {need} s (the rest of a tick plus a checkpoint): the "
                f"checkpoint may not finish; raise the lead (--signal=USR1@{need} or more)"
            )
    return lead


def preemptible(kind):
    """The params function that prefixes a training command with workflow/scripts/preemptible.sh."""
    return lambda wildcards, resources: f"{PREEMPTIBLE} {signal_lead(kind, resources)}"


def log(kind, name):
    return f"results/logs/{kind}/{name}.log"


def bench(kind, name):
    return f"results/benchmarks/{kind}/{name}.tsv"


def all_runs():
    return [
        (pair, condition, seed)
        for pair, cfg in config["pairs"].items()
        for condition in cfg["conditions"]
        for seed in cfg["seeds"]
    ]


def evaluated(pair, condition):
    """Whether the pipeline evaluates this condition of the pair on its benchmarks."""
    chosen = pair_cfg(pair)["eval"].get("conditions")
    return chosen is None or condition in chosen


def all_evals():
    return [
        f"results/eval/{pair}/{condition}/seed{seed}/{benchmark}.json"
        for pair, condition, seed in all_runs()
        if evaluated(pair, condition)
        for benchmark in pair_cfg(pair)["eval"]["benchmarks"]
    ]


def all_summaries():
    return [f"{run_dir(*run)}/summary.json" for run in all_runs()]


def all_sweeps():
    return [f"{sweep_dir(p)}/summary" for p, cfg in config["pairs"].items() if "sweep" in cfg]


def config_files():
    """The config file(s) of this run, as named in error messages."""
    files = [os.path.relpath(f) for f in workflow.configfiles]
    return ", ".join(files) + (" and --config" if workflow.config_settings.config else "")


def ticks_problem(pair, driver, condition, ticks, pair_file):
    """Why `ticks` ticks of `condition` cannot run, as the driver would say it in the job, or None. Local:
    the run's length checks on its composed config (`commrl train` reads it at its last tick; e.g. a
    staleness the ticks cannot hold). verl: the pair's read point (`read_at` of its pair file) must be
    trained. (A run's whole validation imports torch and verl, seconds at every `snakemake` call.)"""
    if driver == "local":
        from commrl.rl.config import check_length, compose_train_config

        overrides = [f"pair={pair}", f"condition={condition}", f"rl.ticks={ticks}", f"rl.read_at={ticks}"]
        rl = compose_train_config(overrides)["rl"]
        try:
            check_length(rl["ticks"], rl["read_at"], rl["staleness"])
        except ConfigError as err:
            return f"{ticks} ticks of {condition}: {err}"
        return None
    read_at = (yaml.safe_load(Path(pair_file).read_text()) or {}).get("read_at")
    if read_at is not None and ticks < read_at:
        return (
            f"{ticks} ticks end before the pair's read point, tick {read_at} (read_at in "
            f"{workdir_path(pair_file)}): give at least {read_at}"
        )
    return None


def dataset_problem(pair, cfg, pair_file):
    """Why the verl pair file trains on other data than `pairs.<pair>.train_data`, or None: `commrl
    verl-train` reads `<data-dir>/<dataset.train of the pair file>/train.parquet` (its validation set comes
    with --val-file), while the job's input, whose rebuild replans the run, is train_data's."""
    train = ((yaml.safe_load(Path(pair_file).read_text()) or {}).get("dataset") or {}).get("train")
    if train is not None and train != cfg["train_data"]:
        return (
            f"{cfg['train_data']!r}, but {workdir_path(pair_file)} trains on dataset.train {train!r} (what "
            f"commrl verl-train reads); make the two the same"
        )
    return None


def config_error(field, message):
    """The error of a bad value of the config: its file, the field's path (pairs.tiny.seeds) and `message`."""
    return WorkflowError(f"{config_files()}: {field}: {message}")


def field_path(parts):
    """A jsonschema path (deque(['pairs', 'tiny', 'seeds', 0])) as a field path: pairs.tiny.seeds[0]."""
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")
    return path or "(top level)"


def schema_problem(error):
    """`field: message` of a failed jsonschema check, naming the bad value and what the schema allows."""
    parts, schema = list(error.absolute_path), error.schema
    if "propertyNames" in error.absolute_schema_path:  # a bad key: the path is the object's
        return f"{field_path([*parts, error.instance])}: {error.message}"
    if error.validator == "additionalProperties" and error.validator_value is False:
        allowed = list(schema.get("properties", {}))
        unknown = [k for k in error.instance if k not in allowed]
        return f"{field_path([*parts, unknown[0]])}: unknown key; allowed here: {', '.join(allowed)}"
    if error.validator == "required":
        missing = ", ".join(k for k in error.validator_value if k not in error.instance)
        required = ", ".join(error.validator_value)
        return f"{field_path(parts)}: missing {missing} (required here: {required})"
    if error.validator == "not":
        return f"{field_path(parts)}: not allowed here ({schema.get('description', 'see the schema')})"
    return f"{field_path(parts)}: {error.message}"


def checked(data, schema, where, context=""):
    """`data`, validated against workflow/schemas/<schema> and with its defaults filled in (a default of
    a whole key applies only where the key is absent); an error names `where` (the file), the field, the
    bad value and what is allowed, then `context`."""
    try:
        validate(data, str(SCHEMAS / schema))
    except WorkflowError as e:
        error = e.__context__  # the jsonschema error that snakemake's validate() wraps
        if not isinstance(error, jsonschema.ValidationError):
            raise
        raise WorkflowError(f"{where}: {schema_problem(error)}{context}") from None
    return data


def condition_problem(condition, driver):
    """Why the `driver` driver cannot run `condition` (no file in configs/condition/, or the file's
    unsupported_drivers names the driver, with why), else None."""
    path = CONDITIONS / f"{condition}.yaml"
    if path.is_file():
        with open(path) as f:
            why = ((yaml.safe_load(f) or {}).get("unsupported_drivers") or {}).get(driver)
        if not why:
            return None
        problem = f"{condition!r} does not run on the {driver} driver: {why}"
    else:
        problem = f"{condition!r} has no configs/condition/{condition}.yaml"
    known = known_conditions(CONDITIONS.parent / "train", driver)  # any tree beside configs/condition/
    return f"{problem}; the {driver} driver runs: {', '.join(known)}"


def check_data(pair, cfg):
    """The pair's data sets are the config's and have the split its training run reads."""
    for key, split in (("train_data", "train.parquet"), ("val_data", "test.parquet")):
        name = cfg.get(key)
        if name is None:
            continue
        if name not in config["datasets"]:
            raise config_error(
                f"pairs.{pair}.{key}",
                f"{name!r} is not in `datasets` ({', '.join(config['datasets'])}); add datasets.{name}",
            )
        if split not in DATASET_FILES[name]:
            raise config_error(
                f"pairs.{pair}.{key}",
                f"{name!r} has no {split} (`commrl prepare --dataset {name}` writes "
                f"{', '.join(DATASET_FILES[name])}); name a data set that has one",
            )


def check_benchmarks(pair, cfg):
    """The pair's benchmarks are the eval registry's (commrl.eval.benchmarks), each with its problems: the
    registry's own source or `data`, a file of the data stage when under results/."""
    made = [f for name in config["datasets"] for f in data_files(name)]
    for name, bench in cfg["eval"]["benchmarks"].items():
        field = f"pairs.{pair}.eval.benchmarks.{name}"
        if name not in BENCHMARKS:
            known = ", ".join(BENCHMARKS)
            raise config_error(field, f"{name!r} is not in the eval registry (commrl.eval.benchmarks): {known}")
        data, registered = bench.get("data"), BENCHMARKS[name]
        if data is None and registered.hub is None:
            jsonl = ", ".join(f for f in made if f.endswith(".jsonl")) or "none here"
            raise config_error(
                field,
                f"no `data`, and the registry has no source for {name}; set data: to a jsonl of problems "
                f"(the data stage writes {jsonl})",
            )
        if data and data.startswith("results/") and data not in made:
            raise config_error(
                f"{field}.data", f"{data!r} is not a file of the data stage (it writes {', '.join(made)})"
            )


def check_config():
    """The config against workflow/schemas/config.schema.yaml, then every cross-reference the schema cannot
    express, before any job is planned; each error names the file, the field, the bad value and the fix."""
    checked(config, "config.schema.yaml", config_files())
    for name, cfg in config["datasets"].items():
        if cfg.get("exclude") == name:
            raise config_error(
                f"datasets.{name}.exclude",
                f"{name!r} excludes itself: `exclude` names the held-out set whose problems are removed from "
                f"this data set (datasets.math.exclude: math500); drop the key from datasets.{name}",
            )
        if "exclude" in cfg and cfg["exclude"] not in config["datasets"]:
            raise config_error(f"datasets.{name}.exclude", f"{cfg['exclude']!r} is not in `datasets`; add it")
    for pair, cfg in config["pairs"].items():
        check_data(pair, cfg)
        for condition in cfg["conditions"]:
            problem = condition_problem(condition, cfg["driver"])
            if problem:
                raise config_error(f"pairs.{pair}.conditions", problem)
        pair_file = tree_dir(DRIVER_TREES[cfg["driver"]]) / "pair" / f"{pair}.yaml"
        if not pair_file.is_file():
            known = ", ".join(sorted(p.stem for p in pair_file.parent.glob("*.yaml"))) or "none"
            raise config_error(
                f"pairs.{pair}",
                f"the {cfg['driver']} driver has no {workdir_path(pair_file)}, the training config of pair "
                f"{pair!r} (its pairs: {known}); add the file, or name one of those pairs",
            )
        problem = dataset_problem(pair, cfg, pair_file) if cfg["driver"] == "verl" else None
        if problem:
            raise config_error(f"pairs.{pair}.train_data", problem)
        run = f"is not in pairs.{pair}.conditions"
        for condition, ticks in cfg["ticks"].items():
            if condition not in cfg["conditions"]:
                raise config_error(f"pairs.{pair}.ticks.{condition}", f"{condition!r} {run}")
            problem = ticks_problem(pair, cfg["driver"], condition, ticks, pair_file)
            if problem:
                raise config_error(f"pairs.{pair}.ticks.{condition}", problem)
        for condition in cfg["eval"].get("conditions", []):
            if condition not in cfg["conditions"]:
                raise config_error(f"pairs.{pair}.eval.conditions", f"{condition!r} {run}")
        check_benchmarks(pair, cfg)
        shipped = cfg.get("pretrain", {}).get("shipped")
        if shipped and not os.path.isfile(os.path.join(shipped, "SHIPPED.json")):
            fix = "give a directory with a SHIPPED.json (assets/tiny-base), or drop the key to pretrain here"
            raise config_error(f"pairs.{pair}.pretrain.shipped", f"{shipped!r} has no SHIPPED.json; {fix}")
        if "sweep" in cfg:
            sweep_config(pair)


def netmodel_configs():
    """Every network-model config the report reads: `commrl report --netmodel configs/netmodel` draws each
    configs/netmodel/pair_*.yaml, whether or not its pair is one of the config's (the tiny report draws pair
    A's analytic model)."""
    return sorted(glob.glob("configs/netmodel/pair_*.yaml"))
