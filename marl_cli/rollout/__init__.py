"""Running episodes and generating completions."""
