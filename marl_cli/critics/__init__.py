"""Value models for the value-based algorithms: the model, its trainer (``Critic``), its losses and a replay buffer."""
