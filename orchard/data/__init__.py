"""The trajectory substrate: tokenizers, chat formats (and, later, trajectories, masks and pipelines)."""
