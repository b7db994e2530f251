# The MLflow store, then one experiment per pair, before any job that logs runs. The store is created
# (migrated) by one job alone, since a fresh sqlite store opened by several processes at once can be left
# half-migrated; each pair's experiment then has a job and a stamp of its own, which that pair's training,
# sweep and study jobs take: adding or removing a pair, or switching configs, leaves the other pairs' jobs
# alone. Experiments of several pairs may be created side by side: the store exists by then, as for the
# training runs that open it together, and a concurrent creation of one experiment is handled
# (commrl.tracking.ensure_experiment).


rule init_store:
    output:
        MLFLOW_STAMP,
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
        "commrl init-store --stamp {output} > {log} 2>&1"


rule init_pair:
    input:
        MLFLOW_STAMP,
    output:
        pair_stamp("{pair}"),
    log:
        log("init", "pairs/{pair}"),
    benchmark:
        bench("init", "pairs/{pair}")
    threads: threads_of("init")
    resources:
        **resources_of("init"),
    conda:
        env("cpu")
    shell:
        "commrl init-store --pair {wildcards.pair} --stamp {output} > {log} 2>&1"
