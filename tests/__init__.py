"""marl test suite: tests mirror the package layout and never touch the network."""
