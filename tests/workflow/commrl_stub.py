"""A stand-in for `commrl` in real `snakemake` runs of the workflow tests (test_rerun.py): each command writes
the files its rule declares, from the flags the rule passes (the CLI contracts test_dag.py checks), and
nothing else. Snakemake then records its jobs as it does for real ones (params, inputs, code), so that a later
dry-run shows what a change of config plans again. Only the commands and data sets of the tiny pipeline."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

DATASET_FILES = {
    "toy": ["train.parquet", "validation.parquet", "test.parquet", "validation.jsonl", "test.jsonl"]
}
MODEL_FILES = ["config.json", "model.safetensors", "base_accuracy.json"]


def option(args: list[str], name: str) -> list[str]:
    """The values of every `name VALUE` of the command line."""
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == name]


def override(args: list[str], key: str) -> str:
    """The value of the Hydra override `key=VALUE`."""
    return next(arg.split("=", 1)[1] for arg in args if arg.startswith(f"{key}="))


def write(path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}\n")


def main(args: list[str]) -> int:
    command, rest = args[0], args[1:]
    out = (option(rest, "--out") or [None])[0]
    if command == "init-store":
        write(option(rest, "--stamp")[0])
    elif command == "prepare":
        for name in [*DATASET_FILES[option(rest, "--dataset")[0]], "manifest.json"]:
            write(Path(out) / name)
    elif command == "pretrain":
        for name in MODEL_FILES:
            write(Path(out) / name)
    elif command == "train":
        run = Path(override(rest, "out_dir"))
        if "COMMRL_STUB_TRAIN_S" in os.environ:  # a job that takes a while: say it started, then wait
            write(os.environ["COMMRL_STUB_MARK"])
            time.sleep(float(os.environ["COMMRL_STUB_TRAIN_S"]))
        write(run / "summary.json")
        write(run / "final" / "model.safetensors")
    elif command == "eval":
        for benchmark in option(rest, "--benchmark"):
            write(Path(option(rest, "--out-dir")[0]) / f"{benchmark}.json")
    elif command == "sweep" and rest[0] == "summary":
        write(Path(out) / "best_params.json")
    elif command == "sweep":
        write(out)
    elif command == "report":
        write(Path(out) / "report.md")
    else:
        print(f"commrl stub: no stand-in for {args}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
