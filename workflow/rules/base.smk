# The base policy of a locally trained pair: the tiny Qwen2 model pretrained on the pair's training data
# (`commrl pretrain`), or that command's checked-in output staged after its checks (pretrain.shipped).
# Paper pairs start from a hub model named in the driver config instead.


rule pretrain:
    input:
        unpack(lambda wildcards: pretrain_inputs(wildcards.pair)),
    output:
        config="results/models/{pair}-base/config.json",
        weights="results/models/{pair}-base/model.safetensors",
        accuracy="results/models/{pair}-base/base_accuracy.json",
    params:
        data=lambda wildcards: data_dir(pair_cfg(wildcards.pair)["train_data"]),
        seed=lambda wildcards: pair_cfg(wildcards.pair)["pretrain"]["seed"],
        options=lambda wildcards: pretrain_options(wildcards.pair),
        out=lambda wildcards, output: os.path.dirname(output.config),
    wildcard_constraints:
        pair=one_of(pairs_with("local")),
    log:
        log("pretrain", "{pair}"),
    benchmark:
        bench("pretrain", "{pair}")
    threads: threads_of("pretrain")
    resources:
        **resources_of("pretrain"),
    conda:
        env("cpu")
    shell:
        "commrl pretrain --data {params.data} --out {params.out} --seed {params.seed} {params.options} > {log} 2>&1"
