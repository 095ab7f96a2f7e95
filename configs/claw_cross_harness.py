r"""Cross-harness training on Orchard-Claw at the main job's scale (orchard.recipes.claw_cross_harness).

Command to run:

  python experiments/claw_cross_harness/run.py            # = --config=configs/claw_cross_harness.py:tiny

The Claw main job's config (configs/claw_grpo.py:tiny) for tasks, teacher, tokenizer, model and SFT, plus
``cross``: which SFT arms (claw = harness A, claw-shell = harness B, both), and harness C (smolagents' CodeAgent
through orchard serve and the recording proxy): its steps, episodes at once and wall clock. RL is not run.

Variants:
  tiny   the main job's scale.
  small  what CI's notebook runs: one task of each family to train on and one held out, a few SFT steps, short
         episodes, the 'both' arm, one smolagents step. It checks that everything runs; its numbers mean nothing.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from configs.claw_grpo import get_config as main_job_config


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "tiny"
    config = main_job_config("tiny")
    config.tasks.rl_fraction = 0.0  # no RL: every training task is the teacher's
    # Harness C's prompt (smolagents' system prompt) must fit the policy's positions; rows stay at sft.seq_len.
    config.model.init.max_position_embeddings = 16384
    config.cross = ConfigDict({"arms": ("claw", "claw-shell", "both"), "third_party_max_turns": 8,
                               "third_party_concurrency": 4, "third_party_wall_clock_s": 300.0})
    if variant == "tiny":
        pass
    elif variant == "small":
        config.tasks.update({"count_per_family": 2, "held_out_share": 0.5, "held_out_family": "", "validation_share": 0.0,
                             "families": ("quick_action", "inbox_triage", "notification_cleanup", "document_edit")})
        config.teacher.update({"samples": 1, "variants": ("clean",)})
        config.sft.update({"num_steps": 4, "log_every": 2, "eval_every": 4, "checkpoint_every": 4, "batch_size": 1})
        config.rl.rollout.update({"max_new_tokens": 16, "max_turns": 2})
        # One arm, the one that draws from both harnesses: every arm runs the same code.
        config.cross.update({"arms": ("both",), "third_party_max_turns": 1, "third_party_wall_clock_s": 120.0})
    else:
        raise ValueError(f"unknown variant {variant!r}: tiny or small")
    return config
