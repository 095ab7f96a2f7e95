"""The recipe runner's evaluation settings."""

from __future__ import annotations

from configs.claw_grpo import get_config
from orchard.recipes.claw import CLAW
from orchard.recipes.runner import sampled_temperature


def test_sampled_passes_run_at_the_eval_temperature_or_else_the_rollouts():
    config = get_config("smoke")
    config.rl.rollout.temperature = 0.9
    assert sampled_temperature(CLAW.typed(config)) == 0.9
    config.eval.temperature = 0.3
    assert sampled_temperature(CLAW.typed(config)) == 0.3
