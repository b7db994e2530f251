"""The cluster driver: the two circuits inside verl 0.9.1's model engine, and ``commrl verl-train``.

Importing this package registers ``TwoCircuitFSDPEngine`` as verl's language-model engine for NVIDIA GPUs
(strategies ``fsdp``/``fsdp2``); verl imports it in every worker through
``actor_rollout_ref.model.external_lib=commrl.verl_ext``.
"""

from commrl.verl_ext.engine import TwoCircuitEngineMixin, TwoCircuitFSDPEngine

__all__ = ["TwoCircuitEngineMixin", "TwoCircuitFSDPEngine"]
