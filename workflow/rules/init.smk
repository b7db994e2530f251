# The MLflow store and the pairs' experiments, created once before any parallel job (a fresh sqlite store
# opened by several processes at once can be left half-migrated). Every MLflow-writing rule needs its stamp.


rule init_store:
    output:
        MLFLOW_STAMP,
    params:
        pairs=" ".join(f"--pair {p}" for p in config["pairs"]),
    log:
        log("init", "init_store"),
    benchmark:
        bench("init", "init_store")
    threads: threads_of("init")
    resources:
        **resources_of("init"),
    conda:
        env("cpu")
    shell:
        "commrl init-store {params.pairs} --stamp {output} > {log} 2>&1"
