"""The trajectory substrate: trajectories, tokenizers, chat formats, training examples with their masks,
rise segments and the Grain pipeline."""
