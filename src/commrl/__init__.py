"""commrl: communication-efficient RL training of language models, end to end."""

__version__ = "0.1.0"
