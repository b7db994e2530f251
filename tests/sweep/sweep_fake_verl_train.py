"""A CPU stand-in for ``commrl verl-train`` (GPU only): same arguments, same MLflow contract.

It creates its run in experiment ``commrl/<pair>`` (kind=train), writes ``<out>/mlflow_run_id``, logs
``val/acc`` every ``val_every`` ticks and ``health/alarm`` every tick, and exits 143 on SIGTERM after
writing ``<out>/terminated``. ``ticks=``, ``val_every=`` come from the overrides, like the real one;
``fail=1`` makes it exit 2 after the first tick.
"""

import argparse
import signal
import sys
import time
from pathlib import Path

from commrl import tracking

parser = argparse.ArgumentParser()
parser.add_argument("--pair")
parser.add_argument("--condition")
parser.add_argument("--seed", type=int)
parser.add_argument("--out", type=Path)
parser.add_argument("overrides", nargs="*")
args = parser.parse_args()
opts = dict(o.split("=", 1) for o in args.overrides)
out: Path = args.out


def on_term(signum, frame):
    (out / "terminated").write_text("SIGTERM\n")
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
client = tracking.client()
exp = tracking.ensure_experiment(tracking.experiment_name(args.pair))
run_id = client.create_run(
    exp, run_name=f"{args.pair}/{args.condition}/seed{args.seed}", tags={"kind": "train", "driver": "verl"}
).info.run_id
(out / "args.txt").write_text(" ".join(sys.argv[1:]) + "\n")
(out / "mlflow_run_id").write_text(run_id + "\n")
ticks, val_every = int(opts["ticks"]), int(opts["val_every"])
rank = int(opts["method.rank"])
client.log_metric(run_id, "val/acc", 0.1, step=0)
for step in range(1, ticks + 1):
    time.sleep(0.05)
    client.log_metric(run_id, "health/alarm", 0.0, step=step)
    if step % val_every == 0:
        client.log_metric(run_id, "val/acc", 0.1 + step / (10 * rank), step=step)
    if opts.get("fail") == "1":
        sys.exit(2)
client.set_terminated(run_id, "FINISHED")
