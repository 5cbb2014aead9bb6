"""The error raised for bad configuration, reported as one line with exit code 2."""


class ConfigError(ValueError):
    """A config value that composes but cannot be used (or a composition failure, rephrased)."""
