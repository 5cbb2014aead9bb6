"""Typed config schemas, config location, and one-line validation of command-line overrides."""
