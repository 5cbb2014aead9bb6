"""Metrics files, Weights & Biases, and the progress display."""
