"""The errors a run reports as one line: bad configuration (exit code 2) and a run stopped by what it depends on
(exit code 1)."""


class ConfigError(ValueError):
    """A config value that composes but cannot be used (or a composition failure, rephrased)."""


class RunError(RuntimeError):
    """A run that cannot go on for a reason one line states (a rollout worker that died or hangs); what it saved
    stands and the line says how to go on."""
