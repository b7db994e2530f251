"""Move every trial of study "race" it can from one state to the next, from a given instant on.

    python sweep_claim.py STORAGE_URL OUT_JSON START_AT_UNIX_TIME claim|fail

``claim``: WAITING -> RUNNING (what ``ask`` does); ``fail``: RUNNING -> FAIL (what a reaper does).
"""

import json
import sys
import time

import optuna
from optuna.trial import TrialState

from commrl.sweep.config import HeartbeatConfig, StorageSpec
from commrl.sweep.storage import open_storage

if __name__ == "__main__":
    url, out, start_at, action = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    source, target = {
        "claim": (TrialState.WAITING, TrialState.RUNNING),
        "fail": (TrialState.RUNNING, TrialState.FAIL),
    }[action]
    storage = open_storage(StorageSpec.parse(url), HeartbeatConfig())
    study = optuna.load_study(study_name="race", storage=storage)
    trials = [t._trial_id for t in study.get_trials(states=(source,))]
    while time.time() < start_at:
        pass
    won = []
    for trial_id in trials:
        try:
            if storage.set_trial_state_values(trial_id, state=target):
                won.append(trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass
    with open(out, "w") as f:
        json.dump(won, f)
