#!/usr/bin/env bash
# Run by snakemake inside the new conda env, in the workflow's working directory (the repository root).
set -euo pipefail
# torch's CPU build is on PyTorch's index, not PyPI (scripts/setup.sh)
python -m pip install -q --no-deps --retries 1 --extra-index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" \
  "$(grep -E '^torch==' requirements/lock-cpu.txt)"
python -m pip install -q --no-deps -r requirements/lock-cpu.txt
python -m pip install -q --no-deps -e .
python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
