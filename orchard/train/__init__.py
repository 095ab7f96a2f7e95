"""Training: sharded Optax trainers for masked SFT and GRPO (BAR, fixed-N, dynamic filtering) over any Task,
with Orbax checkpoints and Grain data."""
