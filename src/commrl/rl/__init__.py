"""RL for the local driver: GRPO through verl's core_algos, samplers, reward, mismatch metrics, trainer."""
