"""Optuna sweeps of the method's knobs (rank, alpha, beta, anchor cadence) on one pair.

``config`` reads ``configs/sweep/<pair>.yaml``; ``space`` is the search space; ``storage`` and ``heartbeat``
keep a study resumable across workers, nodes and crashes; ``study`` creates it once (``commrl sweep init``);
``worker`` runs trials (``objective`` for one trial, ``verl_driver`` for the paper pairs); ``summary``
writes the best params, the trials table, importances and plots. A grid study (``sampler: {name: grid}``)
trains every point of a grid once, with a baseline condition at every prompts x seed (``grid``), and
``grid_summary`` writes its cells (method - baseline per cell with intervals) and a heat map. The CLI is
``commrl.cli.sweep``.
"""

from commrl.sweep.config import SweepConfig, load_sweep_config
from commrl.sweep.space import SearchSpace

__all__ = ["SearchSpace", "SweepConfig", "load_sweep_config"]
