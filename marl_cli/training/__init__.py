"""The training loop, the TRL-backed per-policy update, warm start, evaluation and checkpoints."""
