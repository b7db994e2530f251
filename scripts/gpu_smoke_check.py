#!/usr/bin/env python
"""The checks after scripts/gpu_smoke.sh: what the dense run (``TICKS`` ticks) and the method run (``TICKS``
ticks, then resumed to ``TICKS + 2``) wrote.

    python scripts/gpu_smoke_check.py --out results/smoke --ticks 4   # MLFLOW_TRACKING_URI: the smoke's store

- ``summary.json`` complete with the asked ticks; ``final/`` and ``tick2/`` HF folders;
- every per-tick metric at every step 1..ticks in MLflow -- the resumed ticks too (the run continues);
  ``val/acc`` and verl's own ``val-core/commrl/toy_arith/acc/mean@1`` at step 0 and every 2 ticks;
- some sampled answer verified (``score/mean`` > 0: the prompt template asks for ``\\boxed{}``);
- dense: no fire, ``comm/ratio_vs_dense`` 1, sampler/trainer log-prob correlation >= 0.9;
- method: fires at ticks 0, 2, 4, ..., fewer bytes than dense on the other ticks, a stale replay (projection
  distance > 0), and the resume's changed tick count recorded on the run (tag ``config_changed``).

Exit status 0 when every check passes, 1 otherwise (the failures are listed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

PER_TICK = (
    "score/mean",
    "actor/kl_loss",
    "actor/pg_clipfrac",
    "actor/grad_norm",
    "mismatch/logprob_corr",
    "mismatch/prob_gap",
    "comm/bytes_total",
    "comm/ratio_vs_dense",
    "anchor/fire",
    "health/alarm",
    "time/step_s",
)
VERL_VAL = "val-core/commrl/toy_arith/acc/mean_at_1"  # verl's own name; its MLflow adapter writes @ as _at_
RUN_TICKS = {"dense": 0, "method": 2}  # ticks each run has beyond TICKS (the method run is resumed)


def check_run(client, out: Path, condition: str, asked: int) -> list[str]:
    """The failures of one run (empty when it passes); prints what it read."""
    run = out / "runs" / condition
    summary_file = run / "summary.json"
    if not summary_file.exists():
        return [f"{condition}: no {summary_file} (the run crashed before writing it)"]
    summary = json.loads(summary_file.read_text())
    failures = []
    if not summary["complete"] or summary["ticks_trained"] != asked:
        failures.append(f"{condition}: summary {summary} (want {asked} ticks, complete)")
    for folder in ("final", "tick2"):
        if not (run / folder / "config.json").exists():
            failures.append(f"{condition}: {folder}/ HF folder missing")
    run_id = summary["mlflow_run_id"]

    def history(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(run_id, key)}

    steps = list(range(1, asked + 1))
    for key in PER_TICK:
        logged = sorted(history(key))
        if logged != steps:
            failures.append(f"{condition}: {key} logged at steps {logged}, want {steps}")
    want_val = [0, *range(2, asked + 1, 2)]  # val_before_train, then every trainer.test_freq = 2 ticks
    val, verl_val = history("val/acc"), history(VERL_VAL)
    if sorted(val) != want_val or sorted(verl_val) != want_val:
        failures.append(
            f"{condition}: val/acc at steps {sorted(val)}, {VERL_VAL} at {sorted(verl_val)}; want {want_val}"
        )
    scores = history("score/mean")
    if not scores or max(scores.values()) <= 0.0:
        failures.append(
            f"{condition}: score/mean {scores}: no sampled answer verified (a \\boxed{{}} prompt?)"
        )
    fires = [v for _, v in sorted(history("anchor/fire").items())]
    ratios = [v for _, v in sorted(history("comm/ratio_vs_dense").items())]
    corr = [v for _, v in sorted(history("mismatch/logprob_corr").items())]
    print(
        f"{condition}: ticks {summary['ticks_trained']}, val/acc {val}, score/mean {scores}, "
        f"anchor/fire {fires}, ratio_vs_dense {[round(r, 3) for r in ratios]}, "
        f"logprob_corr {[round(c, 3) for c in corr]}, health/alarm {history('health/alarm')}"
    )
    if condition == "dense" and (any(fires) or set(ratios) != {1.0} or not corr or min(corr) < 0.9):
        failures.append(
            f"dense: anchor/fire {fires}, ratio {ratios}, logprob_corr {corr} (want 0, 1, >= 0.9)"
        )
    if condition == "method":
        if fires != [1.0, 0.0] * (asked // 2):
            failures.append(f"method: anchor/fire {fires} (want fires at ticks 0, 2, 4, ...)")
        if len(ratios) != len(fires) or any(
            r >= 1.0 for r, fire in zip(ratios, fires, strict=True) if not fire
        ):
            failures.append(f"method: ratio_vs_dense {ratios} (want < 1 on the compressed ticks)")
        distance = history("anchor/projection_distance")
        if not any(v > 0 for v in distance.values()):
            failures.append(
                f"method: anchor/projection_distance {distance} (the tick-2 fire replays theta_0)"
            )
        changed = client.get_run(run_id).data.tags.get("config_changed", "")
        if "trainer/total_training_steps" not in changed:
            failures.append(
                f"method: the resume's tick count is not recorded (tag config_changed {changed!r})"
            )
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_smoke_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the smoke's OUT folder")
    parser.add_argument("--ticks", type=int, required=True, help="the smoke's TICKS")
    args = parser.parse_args(argv)
    import mlflow

    client = mlflow.MlflowClient(os.environ.get("MLFLOW_TRACKING_URI"))  # the smoke's store
    failures = []
    for condition, extra in RUN_TICKS.items():
        failures += check_run(client, args.out, condition, args.ticks + extra)
    print("gpu_smoke: " + ("FAILED\n  " + "\n  ".join(failures) if failures else "all checks passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
