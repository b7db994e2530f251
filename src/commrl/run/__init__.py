"""One training run's bookkeeping, written once and read by both drivers, the sweep, eval and the report.

- ``hooks``: ``StopTraining`` and ``TrainCallbacks``, what code that drives training (the sweep) hooks into;
- ``record``: the MLflow run (open or resume, full tag set, config params, finish) and ``DIR/mlflow_run_id``;
- ``fingerprint``: the config a run computes with, recorded when it starts; a resume under another refused;
- ``preempt``: the announced end of a job (SIGUSR1 / SIGTERM): a flag, ``Preempted`` and exit status 75;
- ``forkserver``: local jobs as forks of one process that imported the heavy libraries once (`make
  pipeline`); each job still its own process, streams, signals and exit status;
- ``summary``: ``DIR/summary.json`` (ticks asked and trained, the read point, the final model, val/acc),
  one schema with one writer and one reader.
"""
