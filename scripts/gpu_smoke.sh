#!/usr/bin/env bash
# The cluster driver end to end on one GPU node, in minutes: `commrl verl-train` (verl 0.9.1 + vLLM, the two
# circuits in verl's engine) for a few ticks of the dense baseline and of the method on a small model and the
# toy task, then a resume, then checks of what the runs wrote (summary.json, HF folders, MLflow metrics).
#
#   scripts/gpu_smoke.sh                                   # Qwen/Qwen2.5-0.5B-Instruct from the hub
#   MODEL=/models/Qwen2.5-0.5B-Instruct scripts/gpu_smoke.sh
#   MODEL=results/models/tiny-base GPUS=1 scripts/gpu_smoke.sh   # the tiny model (`commrl pretrain`)
#
# Environment: MODEL (hub id or HF folder), GPUS (GPUs to use, default: all visible), OUT (default
# results/smoke; wiped first), TICKS (default 4). Needs the GPU environment (envs/train-gpu.yaml: verl, vLLM,
# CUDA torch) with commrl installed. Exit status 0 only when every check passes.
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
GPUS=${GPUS:-$(nvidia-smi --list-gpus | wc -l)}
OUT=${OUT:-results/smoke}
TICKS=${TICKS:-4}
[ "$GPUS" -ge 1 ] || { echo "gpu_smoke: no GPU visible (nvidia-smi lists none)" >&2; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT"
export COMMRL_RESULTS="$OUT"                   # MLflow store: $OUT/mlflow.db
export MLFLOW_TRACKING_URI="sqlite:///$(cd "$OUT" && pwd)/mlflow.db"
commrl init-store --pair A
commrl prepare --dataset toy --seed 0 --out "$OUT/data/toy"

# Small shapes: 16 prompts x 4 samples, 256 + 256 tokens, the anchor every 2 ticks (fires at ticks 0 and 2).
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

OUT="$OUT" TICKS="$TICKS" python - <<'EOF'
import json, os, sys
from pathlib import Path

import mlflow

out, ticks = Path(os.environ["OUT"]), int(os.environ["TICKS"])
client = mlflow.MlflowClient()
failures = []
for condition, asked in (("dense", ticks), ("method", ticks + 2)):
    run = out / "runs" / condition
    summary = json.loads((run / "summary.json").read_text())
    if not summary["complete"] or summary["ticks_trained"] != asked:
        failures.append(f"{condition}: summary {summary}")
    if not (run / "final" / "config.json").exists() or not (run / "tick2" / "config.json").exists():
        failures.append(f"{condition}: final/ or tick2/ HF folder missing")
    names = {m for m in client.get_run(summary["mlflow_run_id"]).data.metrics}
    want = {"score/mean", "val/acc", "actor/kl_loss", "actor/pg_clipfrac", "actor/grad_norm", "mismatch/logprob_corr",
            "mismatch/prob_gap", "comm/bytes_total", "comm/ratio_vs_dense", "anchor/fire", "time/step_s"}
    if want - names:
        failures.append(f"{condition}: metrics missing in MLflow: {sorted(want - names)}")
    fires = [m.value for m in client.get_metric_history(summary["mlflow_run_id"], "anchor/fire")]
    ratio = client.get_metric_history(summary["mlflow_run_id"], "comm/ratio_vs_dense")[-1].value
    corr = client.get_metric_history(summary["mlflow_run_id"], "mismatch/logprob_corr")[-1].value
    print(f"{condition}: ticks {summary['ticks_trained']}, anchor/fire {fires}, ratio_vs_dense {ratio:.3f}, "
          f"logprob_corr {corr:.3f}")
    if condition == "method" and (fires[:4] != [1.0, 0.0, 1.0, 0.0] or ratio >= 1.0):
        failures.append(f"method: anchor/fire {fires} (want fires at ticks 0, 2, ...), ratio {ratio}")
    if condition == "dense" and (any(fires) or ratio != 1.0 or corr < 0.9):
        failures.append(f"dense: anchor/fire {fires}, ratio {ratio}, logprob_corr {corr} (want no fire, 1, ~1)")
print("gpu_smoke: " + ("FAILED\n  " + "\n  ".join(failures) if failures else "all checks passed"))
sys.exit(1 if failures else 0)
EOF
