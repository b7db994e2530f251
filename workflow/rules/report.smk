# The note's figures and tables from the MLflow store (`commrl report`), after every run, evaluation and sweep
# of the config and of those alone (`--only` the inputs: a run made by hand in the same store, of the same
# pair, condition and seed, does not replace the pipeline's), with the network model's section (every
# configs/netmodel/pair_*.yaml, whether or not its pair is the config's). The figure list depends on which
# runs exist, so the output is a directory whose files `snakemake --report` picks up by pattern.


rule report:
    input:
        evals=all_evals(),
        runs=all_summaries(),
        sweeps=all_sweeps(),
        netmodel=netmodel_configs(),
    output:
        report(
            directory("results/report"),
            patterns=["{name}.png", "{name}.md", "{name}.html", "{name}.json"],
            caption="../report/report-file.rst",
            category="commrl report",
            labels={"file": "{name}"},
        ),
    params:
        pairs=" ".join(f"--pair {p}" for p in config["pairs"]),
    log:
        log("report", "report"),
    benchmark:
        bench("report", "report")
    threads: threads_of("report")
    resources:
        **resources_of("report"),
    conda:
        env("cpu")
    shell:
        "commrl report {params.pairs} --netmodel configs/netmodel --out {output}"
        " --only {input.runs} {input.evals} {input.sweeps} > {log} 2>&1"
