"""The one error of a bad configuration, raised by every config object and caught by every CLI.

Each config object checks its own ranges once (its ``validate``) and raises ``ConfigError``; keys and types
of the training config are checked by its Hydra/OmegaConf schema (``commrl.rl.config``). Every ``commrl``
command prints a ``ConfigError`` as ``commrl <command>: error: <message>`` and exits 2
(``commrl.cli.main``).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message names the field path once,
    the bad value and what is allowed."""
