"""marl: train LLM multi-agent systems with reinforcement learning from the command line."""
