"""The ``marl`` command and its subcommands."""
