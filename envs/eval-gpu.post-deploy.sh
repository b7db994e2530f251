#!/usr/bin/env bash
# Run by snakemake inside the new conda env, in the workflow's working directory (the repository root).
set -euo pipefail
python -m pip install -q --no-deps -e .
