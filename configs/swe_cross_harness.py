r"""Cross-harness training on Orchard-SWE at the main job's scale (orchard.recipes.cross_harness).

Command to run:

  python experiments/swe_cross_harness/run.py             # = --config=configs/swe_cross_harness.py:tiny

The main job's config (configs/swe_bar.py:tiny) for tasks, teacher, tokenizer, model and SFT, plus ``cross``:
which SFT arms (bash = harness A, codeact = harness B, both), the passes evaluated in A and B, and harness C
(smolagents' CodeAgent through orchard serve and the recording proxy): its passes, steps, episodes at once and
wall clock. RL is not run.

Variants:
  tiny   the main job's scale.
  small  what CI's notebook runs: a few tasks, the 'both' arm, a few SFT steps, greedy passes only, one smolagents step.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from configs.swe_bar import get_config as main_job_config


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "tiny"
    config = main_job_config("tiny")
    # Harness C's prompt (smolagents' system prompt is ~5,600 tokens of the trained BPE) must fit the policy's
    # context; RoPE has no learnt positions, and training rows stay at sft.seq_len.
    config.model.init.max_position_embeddings = 8192
    # Harness B's prompt holds its tools' schemas: a CodeAct teacher trajectory is ~2,800 tokens of the BPE where a
    # bash one is ~940, so rows and the rollout context grow to hold it (at the main job's 1,024 every CodeAct row
    # was cut before its first action: zero loss). The rows are three times longer, so one a step, not four.
    config.sft.update({"seq_len": 3072, "batch_size": 1})
    config.rl.rollout.max_context = 4096
    config.rl.seq_len = 4160
    config.cross = ConfigDict({"arms": ("bash", "codeact", "both"), "passes": ("greedy", "sampled"),
                               "third_party_passes": ("greedy",), "third_party_max_turns": 4,
                               "third_party_concurrency": 4, "third_party_wall_clock_s": 300.0})
    if variant == "tiny":
        pass
    elif variant == "small":
        config.tasks.count = 8
        config.teacher.update({"samples": 1, "variants": ("clean",)})
        config.sft.update({"num_steps": 4, "eval_every": 4, "checkpoint_every": 4, "log_every": 2})
        config.rl.rollout.update({"max_turns": 2, "max_new_tokens": 32})
        # One arm, the one that draws from both harnesses: every arm runs the same code (tests/recipes cover the
        # split into arms).
        config.cross.update({"arms": ("both",), "passes": ("greedy",), "third_party_max_turns": 1,
                             "third_party_wall_clock_s": 120.0})
    else:
        raise ValueError(f"unknown variant {variant!r}: tiny or small")
    return config
