# An Optuna sweep of the method's knobs on one pair: `init` creates the storage and the study, enqueues
# the defaults and the MLflow parent run (once); the workers share the storage and each runs trials until
# the study's budget is used; `summary` writes best_params.json, trials.csv and the plots. The storage is
# not a declared output: every worker writes to it. Reruns resume: a worker finishes only what is left. A
# worker's inputs include the config files its trials compose (common.smk, trial_configs).


rule sweep_init:
    input:
        store=lambda wildcards: pair_stamp(wildcards.pair),
        config=lambda wildcards: pair_cfg(wildcards.pair)["sweep"]["config"],
    output:
        "results/sweeps/{pair}/{study}/init.json",
    log:
        log("sweep", "{pair}/{study}/init"),
    benchmark:
        bench("sweep", "{pair}/{study}/init")
    threads: threads_of("init")
    resources:
        **resources_of("init"),
    conda:
        env("cpu")
    shell:
        "commrl sweep init --config {input.config} --study {wildcards.study} --out {output} > {log} 2>&1"


rule sweep_worker:
    input:
        unpack(lambda wildcards: train_inputs(wildcards.pair)),
        init="results/sweeps/{pair}/{study}/init.json",
        config=lambda wildcards: pair_cfg(wildcards.pair)["sweep"]["config"],
        composed=lambda wildcards: trial_configs(sweep_config(wildcards.pair)),
    output:
        "results/sweeps/{pair}/{study}/worker{worker}.json",
    params:
        preemptible=preemptible("sweep"),
    log:
        log("sweep", "{pair}/{study}/worker{worker}"),
    benchmark:
        bench("sweep", "{pair}/{study}/worker{worker}")
    threads: threads_of("sweep")
    resources:
        **resources_of("sweep"),
    conda:
        pair_env("train")
    shell:
        "exec {params.preemptible} {log} commrl sweep worker --config {input.config} --study {wildcards.study}"
        " --worker {wildcards.worker}"
        " --out {output} > {log} 2>&1"


rule sweep_summary:
    input:
        workers=lambda wildcards: expand(
            "results/sweeps/{{pair}}/{{study}}/worker{worker}.json", worker=sweep_workers(wildcards.pair)
        ),
        config=lambda wildcards: pair_cfg(wildcards.pair)["sweep"]["config"],
    output:
        directory("results/sweeps/{pair}/{study}/summary"),
    log:
        log("sweep", "{pair}/{study}/summary"),
    benchmark:
        bench("sweep", "{pair}/{study}/summary")
    threads: threads_of("report")
    resources:
        **resources_of("report"),
    conda:
        env("cpu")
    shell:
        "commrl sweep summary --config {input.config} --study {wildcards.study} --out {output} > {log} 2>&1"
