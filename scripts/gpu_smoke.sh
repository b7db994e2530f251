#!/usr/bin/env bash
# The cluster driver end to end on one GPU node, in minutes: `commrl verl-train` (verl 0.9.1 + vLLM, the two
# circuits in verl's engine) for a few ticks of the dense baseline and of the method on a small model and the
# toy task, then a resume of the method run with more ticks, then checks of what the runs wrote
# (summary.json, HF folders, the MLflow metrics of every tick, the resumed ones included).
#
#   scripts/gpu_smoke.sh                                   # Qwen/Qwen2.5-0.5B-Instruct from the hub
#   MODEL=/models/Qwen2.5-0.5B-Instruct scripts/gpu_smoke.sh
#   MODEL=results/models/tiny-base PROMPT_TEMPLATE='{problem}=' GPUS=1 scripts/gpu_smoke.sh   # the tiny
#                                                          #   model (`commrl pretrain`), on its own template
#
# Environment: MODEL (hub id or HF folder), GPUS (GPUs to use, default: all visible), OUT (default
# results/smoke; wiped first), TICKS (default 4; even), PROMPT_TEMPLATE (the toy task's user message; the
# default asks for the answer in \boxed{}, since the reward scores only a boxed answer and an instruct model
# answers the bare "47+18=" in prose). Needs the GPU environment (envs/train-gpu.yaml: verl, vLLM, CUDA
# torch) with commrl installed; first run `python scripts/gpu_engine_check.py` (the engine alone, ~minutes).
# Exit status 0 only when every check passes (scripts/gpu_smoke_check.py).
set -euo pipefail

command -v nvidia-smi >/dev/null || { echo "gpu_smoke: nvidia-smi not found: no NVIDIA GPU here" >&2; exit 1; }
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
GPUS=${GPUS:-$(nvidia-smi --list-gpus | wc -l)}
OUT=${OUT:-results/smoke}
TICKS=${TICKS:-4}
PROMPT_TEMPLATE=${PROMPT_TEMPLATE:-$'{problem}\nPut your final answer within \\boxed{}.'}
[ "$GPUS" -ge 1 ] || { echo "gpu_smoke: no GPU visible (nvidia-smi lists none)" >&2; exit 1; }
[ $((TICKS % 2)) -eq 0 ] && [ "$TICKS" -ge 4 ] || { echo "gpu_smoke: TICKS=$TICKS must be even, >= 4" >&2; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT"
export COMMRL_RESULTS="$OUT"                   # MLflow store: $OUT/mlflow.db
export MLFLOW_TRACKING_URI="sqlite:///$(cd "$OUT" && pwd)/mlflow.db"
commrl init-store --pair A
commrl prepare --dataset toy --seed 0 --out "$OUT/data/toy" --prompt-template "$PROMPT_TEMPLATE"

# Small shapes: 16 prompts x 4 samples, 256 + 256 tokens, the anchor every 2 ticks (fires at ticks 0, 2, ...;
# h = K = 2: the tick-2 fire replays the stale tick-0 view), validation every 2 ticks, read at tick 2.
SMALL=(
  "actor_rollout_ref.model.path=$MODEL"
  "data.train_files=$OUT/data/toy/train.parquet"
  "data.val_files=$OUT/data/toy/validation.parquet"
  "data.val_max_samples=64"
  data.train_batch_size=16
  data.max_prompt_length=256
  data.max_response_length=256
  actor_rollout_ref.rollout.n=4
  actor_rollout_ref.actor.ppo_mini_batch_size=16
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4
  "trainer.n_gpus_per_node=$GPUS"
  "trainer.total_training_steps=$TICKS"
  trainer.test_freq=2
  trainer.save_freq=2
  method.cadence=2
  method.delay=2
  read_at=2
)

for condition in dense method; do
  echo "== gpu_smoke: $condition, $TICKS ticks"
  commrl verl-train --pair A --condition "$condition" --seed 0 --out "$OUT/runs/$condition" "${SMALL[@]}"
done

echo "== gpu_smoke: resume the method run to $((TICKS + 2)) ticks"
commrl verl-train --pair A --condition method --seed 0 --out "$OUT/runs/method" "${SMALL[@]}" \
  "trainer.total_training_steps=$((TICKS + 2))"

python "$(dirname "$0")/gpu_smoke_check.py" --out "$OUT" --ticks "$TICKS"
