# One benchmark on one checkpoint = one job: results/eval/<pair>/<condition>/seed<k>/<benchmark>.json.
# The run's summary.json is the input: it carries the MLflow run id the evaluation is nested under and names
# the model at the pair's read tick (`read`: final/, or tick<read_at>/ for runs that train past it, such as
# pair A's KL runs), the one `commrl eval --summary` evaluates; a summary that names none fails the job.


rule eval:
    input:
        unpack(eval_inputs),
    output:
        "results/eval/{pair}/{condition}/seed{seed}/{benchmark}.json",
    params:
        backend=lambda wildcards: pair_cfg(wildcards.pair)["eval"]["backend"],
        options=eval_options,
    log:
        log("eval", "{pair}/{condition}/seed{seed}/{benchmark}"),
    benchmark:
        bench("eval", "{pair}/{condition}/seed{seed}/{benchmark}")
    threads: threads_of("eval")
    resources:
        **resources_of("eval"),
    conda:
        pair_env("eval")
    shell:
        "commrl eval --benchmark {wildcards.benchmark} --pair {wildcards.pair}"
        " --backend {params.backend} --summary {input.summary} {params.options} --out {output} > {log} 2>&1"
