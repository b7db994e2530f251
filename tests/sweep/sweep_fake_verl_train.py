"""A CPU stand-in for ``commrl verl-train`` (GPU only): same arguments, same run record.

It opens its run through ``commrl.run.record`` (placed by ``--run-spec``, as the real one), logs ``val/acc``
every ``val_every`` ticks and ``health/alarm`` every tick, and writes ``summary.json`` through
``commrl.run.summary`` at the end; it exits 143 on SIGTERM after writing ``<out>/terminated``. ``ticks=``,
``val_every=``, ``read_at=`` come from the overrides, like the real one; ``fail=1`` makes it exit 2 after
the first tick. Only the training (verl on GPUs) is missing.
"""

import argparse
import signal
import sys
import time
from pathlib import Path

from commrl import tracking
from commrl.run import record
from commrl.run.summary import RunSummary

parser = argparse.ArgumentParser()
parser.add_argument("--pair")
parser.add_argument("--condition")
parser.add_argument("--seed", type=int)
parser.add_argument("--out", type=Path)
parser.add_argument("--run-spec", default=None)
parser.add_argument("overrides", nargs="*")
args = parser.parse_args()
opts = dict(o.split("=", 1) for o in args.overrides)
out: Path = args.out


def on_term(signum, frame):
    (out / "terminated").write_text("SIGTERM\n")
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
ticks, val_every, read_at = int(opts["ticks"]), int(opts["val_every"]), int(opts["read_at"])
identity = record.RunIdentity(args.pair, args.condition, args.seed, "lowrank", "verl", ticks, read_at)
placement = record.RunSpec.from_json(args.run_spec) if args.run_spec else None
run_id, _ = record.open_run(identity, out, spec=placement)
client = tracking.client()
(out / "args.txt").write_text(" ".join(sys.argv[1:]) + "\n")
rank = int(opts["method.rank"])
val = {0: 0.1}
client.log_metric(run_id, "val/acc", 0.1, step=0)
for step in range(1, ticks + 1):
    time.sleep(0.05)
    client.log_metric(run_id, "health/alarm", 0.0, step=step)
    if step % val_every == 0:
        val[step] = 0.1 + step / (10 * rank)
        client.log_metric(run_id, "val/acc", val[step], step=step)
    if opts.get("fail") == "1":
        sys.exit(2)
RunSummary(
    args.pair, args.condition, args.seed, "verl", ticks, ticks, run_id, None, read_at, None, val
).write(out)
record.finish_run(run_id, "FINISHED")
