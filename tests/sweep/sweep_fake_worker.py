"""``commrl sweep worker`` with the fast stand-in driver, as a separate process (for kill -9 tests).

python sweep_fake_worker.py CONFIG STUDY WORKER OUT_JSON SLEEP_S
"""

import json
import sys

from sweep_fakes import FakeDriver

from commrl.sweep.config import load_sweep_config
from commrl.sweep.worker import run_worker

if __name__ == "__main__":
    config, study, worker, out, sleep = sys.argv[1:6]
    cfg = load_sweep_config(config)
    record = run_worker(cfg, study, int(worker), driver=FakeDriver(cfg.ticks, cfg.val_every, float(sleep)))
    with open(out, "w") as f:
        json.dump(record, f)
