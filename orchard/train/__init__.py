"""Training: sharded Optax trainers (SFT here, GRPO later) with Orbax checkpoints and Grain data."""
