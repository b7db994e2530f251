# One training run = (pair, condition, seed) -> results/runs/<pair>/<condition>/seed<seed>/summary.json and
# final/ (an HF model directory). Both drivers resume from their own checkpoints (checkpoints/ is not a
# declared output, so Snakemake leaves it alone on a rerun) and exit non-zero when they trained fewer ticks
# than asked; 75 when a preemption or time-limit warning stopped them after a checkpoint, which
# workflow/scripts/preemptible.sh turns into a requeue of the Slurm job. The config files the run composes
# (its driver's tree and its condition's file: common.smk, run_configs) are inputs: a change plans it again.


rule train_local:
    input:
        unpack(lambda wildcards: train_inputs(wildcards.pair)),
        composed=lambda wildcards: run_configs(wildcards.pair, wildcards.condition),
    output:
        summary="results/runs/{pair}/{condition}/seed{seed}/summary.json",
        final=directory("results/runs/{pair}/{condition}/seed{seed}/final"),
    params:
        out=lambda wildcards, output: os.path.dirname(output.summary),
        model=lambda wildcards, input: os.path.dirname(input.model),
        data=lambda wildcards, input: os.path.dirname(input.train),
        ticks=lambda wildcards: ticks_override(wildcards.pair, wildcards.condition),
        preemptible=preemptible("train"),
    wildcard_constraints:
        pair=one_of(pairs_with("local")),
    log:
        log("train", "{pair}/{condition}/seed{seed}"),
    benchmark:
        bench("train", "{pair}/{condition}/seed{seed}")
    threads: threads_of("train")
    resources:
        **resources_of("train"),
    conda:
        env("train")
    shell:
        "exec {params.preemptible} {log} commrl train pair={wildcards.pair} condition={wildcards.condition} seed={wildcards.seed}"
        " out_dir={params.out} model.path={params.model} data.dir={params.data} threads={threads} {params.ticks}"
        " > {log} 2>&1"


rule train_verl:
    input:
        unpack(lambda wildcards: train_inputs(wildcards.pair)),
        composed=lambda wildcards: run_configs(wildcards.pair, wildcards.condition),
    output:
        summary="results/runs/{pair}/{condition}/seed{seed}/summary.json",
        final=directory("results/runs/{pair}/{condition}/seed{seed}/final"),
    params:
        out=lambda wildcards, output: os.path.dirname(output.summary),
        data_root=lambda wildcards, input: os.path.dirname(os.path.dirname(input.train)),
        ticks=lambda wildcards: ticks_override(wildcards.pair, wildcards.condition),
        preemptible=preemptible("train"),
    wildcard_constraints:
        pair=one_of(pairs_with("verl")),
    log:
        log("train", "{pair}/{condition}/seed{seed}"),
    benchmark:
        bench("train", "{pair}/{condition}/seed{seed}")
    threads: threads_of("train")
    resources:
        **resources_of("train"),
    conda:
        env("train", driver="verl")
    shell:
        "exec {params.preemptible} {log} commrl verl-train --pair {wildcards.pair} --condition {wildcards.condition} --seed {wildcards.seed}"
        " --out {params.out} --data-dir {params.data_root} --val-file {input.val} {params.ticks} > {log} 2>&1"
