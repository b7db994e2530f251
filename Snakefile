# commrl: data -> base policy -> training runs -> evaluations (+ Optuna sweep) -> report.
#
#   snakemake --cores 2                                   the tiny pair end to end (configs/pipeline/tiny.yaml)
#   snakemake --configfile configs/pipeline/paper.yaml --profile slurm --sdm conda   pairs A and B on Slurm
#   snakemake results/eval/tiny/method/seed0/toy_greedy.json --cores 2      one run's evaluation job
#   snakemake results/studies/tiny-regime/summary --cores 2                 a grid study (not default)
#   snakemake --report results/report.html                                    the figures, bundled
# Targets go before --configfile (it takes several values). A --configfile replaces the default config
# rather than being merged over it: give the whole config (e.g. a copy of tiny.yaml with changes).
#
# Rules only call `commrl <command>` (training ones through workflow/scripts/preemptible.sh); see
# docs/design.md for the contracts.

from snakemake.utils import min_version

min_version("9.27")


# The default config, unless one is given on the command line.
if not workflow.overwrite_configfiles:

    configfile: "configs/pipeline/tiny.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# The config against workflow/schemas/config.schema.yaml, then its cross-references, before any job.
check_config()


include: "workflow/rules/init.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/base.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/study.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        "results/report",
