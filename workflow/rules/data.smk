# Data sets in verl's parquet schema (+ jsonl of held-out splits for lm-eval, + manifest.json): one rule
# prepare_<name> per data set of the config, all from this one definition. Each data set writes its own
# splits (common.smk: DATASET_FILES) and Snakemake's outputs cannot vary with a wildcard's value, so the
# rule is keyed by the loop's name rather than by a {dataset} wildcard.

for dataset in config["datasets"]:

    rule:
        name: f"prepare_{dataset}"
        input:
            exclude=excluded(dataset),
        output:
            data_files(dataset),
        params:
            dataset=dataset,
            options=prepare_options(dataset),
            out=lambda wildcards, output: os.path.dirname(output[0]),
        log:
            log("data", dataset),
        benchmark:
            bench("data", dataset)
        threads: threads_of("data")
        resources:
            **resources_of("data"),
        conda:
            env("cpu")
        shell:
            "commrl prepare --dataset {params.dataset} {params.options} --out {params.out} > {log} 2>&1"
