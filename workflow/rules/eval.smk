# Evaluations of a run's read-point checkpoint: results/eval/<pair>/<condition>/seed<k>/<benchmark>.json.
# The run's summary.json is the input: it carries the MLflow run id the evaluation is nested under and names
# the model at the pair's read tick (`read`: final/, or tick<read_at>/ for runs that train past it, such as
# pair A's KL runs), the one `commrl eval --summary` evaluates; a summary that names none fails the job.
#
# One rule eval_<pair> per pair, all from this definition. `eval.job_per` chooses the job: `benchmark`
# (one job per checkpoint and benchmark: a failure costs one benchmark; the cluster pairs) or `checkpoint`
# (one job evaluates every benchmark of the pair with one model: one vLLM import and engine build instead of
# one per benchmark, the tiny pair's; a failed job reruns its benchmarks). A benchmark's files, summary and
# MLflow run are the same either way (lm-eval reseeds before each benchmark: tests/eval/test_eval_cli.py;
# on GPUs vLLM samples in its own process, which the reseed does not reach: `commrl eval` refuses several
# sampled benchmarks in one GPU job).

for pair in config["pairs"]:
    per_checkpoint = eval_per_checkpoint(pair)
    job = "all" if per_checkpoint else "{benchmark}"

    rule:
        name: f"eval_{pair}"
        input:
            unpack(eval_inputs(pair)),
        output:
            eval_outputs(pair),
        params:
            backend=pair_cfg(pair)["eval"]["backend"],
            options=eval_options(pair),
            pair=pair,
        log:
            log("eval", f"{pair}/{{condition}}/seed{{seed}}/{job}"),
        benchmark:
            bench("eval", f"{pair}/{{condition}}/seed{{seed}}/{job}")
        threads: threads_of("eval")
        resources:
            **resources_of("eval"),
        conda:
            env("eval", pair_cfg(pair)["driver"])
        shell:
            "commrl eval {params.options} --pair {params.pair} --backend {params.backend}"
            " --summary {input.summary} > {log} 2>&1"


# A run or evaluation target of a pair the config does not name: pair_cfg's error (the pair, the pairs there
# are, the fix) instead of Snakemake's "No rule to produce". It never runs: its input function raises.
rule unknown_pair:
    input:
        lambda wildcards: pair_cfg(wildcards.pair),
    output:
        "results/{kind}/{pair}/{path}",
    wildcard_constraints:
        kind="runs|eval",
        pair=f"(?!(?:{'|'.join(map(re.escape, config['pairs']))})/)[^/]+",
    log:
        log("unknown_pair", "{kind}/{pair}/{path}"),
    conda:
        env("cpu")
    shell:
        "false > {log}"
