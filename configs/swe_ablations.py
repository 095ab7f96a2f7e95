r"""The paper's SWE ablations at the main job's scale (orchard.recipes.swe_ablations).

Commands to run (each study alone; they share the workdir's tasks, teacher data and tokenizer):

  python experiments/swe_ablations/run.py --config.studies=credit   # credit-assignment SFT
  python experiments/swe_ablations/run.py --config.studies=scale    # SFT data scale against selection
  python experiments/swe_ablations/run.py --config.studies=rl       # BAR vs fixed-N vs dynamic; light vs heavy init
  python experiments/swe_ablations/run.py --config.studies=async --markdown docs/benchmarks.md  # async vs sync RL

The main job's config (configs/swe_bar.py:tiny) for tasks, teacher, tokenizer, model, SFT and RL, plus one
block a study: ``credit`` (its arms, seeds, passes and the LLM judge's few trajectories), ``scale`` (fractions,
selectors, seeds), ``rl_study`` (samplers, seeds, the SFT steps of the initialisations, the held-out curve's
interval) and ``async_study`` (the staleness bounds, seeds and RL steps); ``rl.rollout_budget`` is the RL
study's equal budget of rollouts generated per run (the async study compares equal numbers of updates).

Variants:
  tiny   the main job's scale (docs/benchmarks.md has what it measured and what it cost).
  small  what CI's notebooks run: a few tasks, a few SFT steps, one seed, two credit arms, tiny budgets. Its numbers
         mean nothing.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from configs.swe_bar import get_config as main_job_config


def get_config(arg: str | None = None) -> ConfigDict:
    variant = arg or "tiny"
    config = main_job_config("tiny")
    config.studies = ("credit", "scale", "rl")
    # Arms at matched resolved trajectories (drop, rise, whole) and at matched trained tokens (filled to drop's).
    # (whole_matched_tokens is also an arm; left out here for the time it costs)
    config.credit = ConfigDict({"arms": ("drop", "rise", "whole", "rise_matched_tokens"),
                                "seeds": (0, 1, 2), "passes": ("greedy", "sampled"), "judge_trajectories": 3,
                                "judge_model": "smollm2", "judge_max_tokens": 256, "judge_dtype": "float32"})
    config.scale = ConfigDict({"fractions": (0.25, 0.5, 1.0), "selectors": ("random", "diverse"),
                               "seeds": (0, 1), "passes": ("greedy", "sampled")})
    # The samplers from the 700-step SFT policy (the main job's), BAR also from a 250-step one; each run stops at
    # the rollout budget: about 5 BAR steps of 8 prompts (the main job's RL spends about 40 rollouts a step).
    config.rl.rollout_budget = 200
    config.rl_study = ConfigDict({"samplers": ("bar", "fixed", "dynamic"), "seeds": (0, 1, 2), "init_steps": (250, 700),
                                  "max_steps": 100, "eval_every": 2})
    # Asynchronous RL at each staleness bound, from the main job's SFT policy, for the main job's 14 updates.
    config.async_study = ConfigDict({"bounds": (0, 1, 2), "seeds": (0, 1, 2), "num_steps": 14,
                                     "passes": ("greedy", "sampled")})
    config.eval.samples = 4  # sampled held-out episodes a task, for every arm of every seed
    if variant == "tiny":
        pass
    elif variant == "small":
        config.tasks.count = 16
        config.teacher.update({"samples": 2, "concurrency": 4})
        config.sft.update({"num_steps": 4, "eval_every": 4, "checkpoint_every": 4, "log_every": 2})
        config.rl.rollout.update({"max_turns": 2, "max_new_tokens": 24})
        config.rl.update({"prompts_per_step": 2, "rollout_budget": 8, "rows": 8, "micro_rows": 4})
        config.rl.sampler.update({"group_size": 2, "max_budget": 4, "stride": 2})
        config.eval.samples = 2
        # drop (the others' token budget) and rise at matched tokens: every arm runs the same code
        config.credit.update({"arms": ("drop", "rise_matched_tokens"), "seeds": (0,),
                              "judge_trajectories": 1, "judge_max_tokens": 48})
        config.scale.update({"fractions": (0.5, 1.0), "selectors": ("random", "diverse"), "seeds": (0,)})
        config.rl_study.update({"samplers": ("bar", "fixed"), "seeds": (0,), "init_steps": (2, 4), "max_steps": 4,
                                "eval_every": 2})
        config.async_study.update({"bounds": (0, 1), "seeds": (0,), "num_steps": 2})
    else:
        raise ValueError(f"unknown variant {variant!r}: tiny or small")
    return config
