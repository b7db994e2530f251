# Grid studies, outside the default target: configs/sweep/<study>.yaml with `sampler: {name: grid}` (e.g.
# tiny-regime.yaml, the method's regime on the tiny pair), run by `snakemake results/studies/<study>/summary`.
# The same three steps as a sweep (sweep.smk): `init` checks the grid, creates the study (and its baseline's,
# `<study>-<baseline>`), queues every point and the MLflow parent runs (once); the workers share the storage
# and train the points until every one is done; `summary` writes cells.csv, cells.json, runs.csv and
# heatmap.png. The storage is not a declared output: every worker writes to it. Reruns resume: a worker
# trains only the points left, a killed trial resumes from its checkpoints. The trials' folders are the
# sweep's: results/sweeps/<pair>/<study>/trials/ (and <study>-<baseline>/trials/).


rule study_init:
    input:
        store=lambda wildcards: pair_stamp(study_pair(wildcards.study)),
        config=lambda wildcards: study_file(wildcards.study),
    output:
        "results/studies/{study}/init.json",
    log:
        log("study", "{study}/init"),
    benchmark:
        bench("study", "{study}/init")
    threads: threads_of("init")
    resources:
        **resources_of("init"),
    conda:
        env("cpu")
    shell:
        "commrl sweep init --config {input.config} --study {wildcards.study} --out {output} > {log} 2>&1"


rule study_worker:
    input:
        unpack(lambda wildcards: train_inputs(study_pair(wildcards.study))),
        init="results/studies/{study}/init.json",
        config=lambda wildcards: study_file(wildcards.study),
        composed=lambda wildcards: trial_configs(study_config(wildcards.study)),
    output:
        "results/studies/{study}/worker{worker}.json",
    params:
        preemptible=preemptible("sweep"),
    log:
        log("study", "{study}/worker{worker}"),
    benchmark:
        bench("study", "{study}/worker{worker}")
    threads: threads_of("sweep")
    resources:
        **resources_of("sweep"),
    conda:
        lambda wildcards: env("train", pair_cfg(study_pair(wildcards.study))["driver"])
    shell:
        "exec {params.preemptible} {log} commrl sweep worker --config {input.config} --study {wildcards.study}"
        " --worker {wildcards.worker} --out {output} > {log} 2>&1"


rule study_summary:
    input:
        workers=lambda wildcards: expand(
            "results/studies/{{study}}/worker{worker}.json", worker=study_workers(wildcards.study)
        ),
        config=lambda wildcards: study_file(wildcards.study),
    output:
        directory("results/studies/{study}/summary"),
    log:
        log("study", "{study}/summary"),
    benchmark:
        bench("study", "{study}/summary")
    threads: threads_of("report")
    resources:
        **resources_of("report"),
    conda:
        env("cpu")
    shell:
        "commrl sweep summary --config {input.config} --study {wildcards.study} --out {output} > {log} 2>&1"
