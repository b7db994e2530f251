# Data sets in verl's parquet schema (+ jsonl of held-out splits for lm-eval, + manifest.json), one rule per
# kind because each writes a different set of splits (common.smk: DATASET_FILES).


rule prepare_toy:
    output:
        data_files("toy"),
    params:
        seed=config["datasets"].get("toy", {"seed": 0})["seed"],
        out=lambda wildcards, output: os.path.dirname(output[0]),
    log:
        log("data", "toy"),
    benchmark:
        bench("data", "toy")
    threads: threads_of("data")
    resources:
        **resources_of("data"),
    conda:
        env("cpu")
    shell:
        "commrl prepare --dataset toy --seed {params.seed} --out {params.out} > {log} 2>&1"


rule prepare_math500:
    input:
        exclude=excluded("math500"),
    output:
        data_files("math500"),
    params:
        source=config["datasets"].get("math500", {}).get("source", ""),
        exclude=lambda wildcards, input: f"--exclude {input.exclude}" if input.exclude else "",
        out=lambda wildcards, output: os.path.dirname(output[0]),
    log:
        log("data", "math500"),
    benchmark:
        bench("data", "math500")
    threads: threads_of("data")
    resources:
        **resources_of("data"),
    conda:
        env("cpu")
    shell:
        "commrl prepare --dataset math500 --source {params.source:q} {params.exclude}"
        " --out {params.out} > {log} 2>&1"


rule prepare_math:
    input:
        exclude=excluded("math"),
    output:
        data_files("math"),
    params:
        source=config["datasets"].get("math", {}).get("source", ""),
        exclude=lambda wildcards, input: f"--exclude {input.exclude}" if input.exclude else "",
        out=lambda wildcards, output: os.path.dirname(output[0]),
    log:
        log("data", "math"),
    benchmark:
        bench("data", "math")
    threads: threads_of("data")
    resources:
        **resources_of("data"),
    conda:
        env("cpu")
    shell:
        "commrl prepare --dataset math --source {params.source:q} {params.exclude}"
        " --out {params.out} > {log} 2>&1"


rule prepare_deepscaler:
    input:
        exclude=excluded("deepscaler"),
    output:
        data_files("deepscaler"),
    params:
        source=config["datasets"].get("deepscaler", {}).get("source", ""),
        exclude=lambda wildcards, input: f"--exclude {input.exclude}" if input.exclude else "",
        out=lambda wildcards, output: os.path.dirname(output[0]),
    log:
        log("data", "deepscaler"),
    benchmark:
        bench("data", "deepscaler")
    threads: threads_of("data")
    resources:
        **resources_of("data"),
    conda:
        env("cpu")
    shell:
        "commrl prepare --dataset deepscaler --source {params.source:q} {params.exclude}"
        " --out {params.out} > {log} 2>&1"
