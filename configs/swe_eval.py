r"""Evaluate a policy directory on an SWE-bench-format instance file (orchard.recipes.swe_eval).

  python experiments/swe_eval/run.py --config.policy=runs/swe_bar_tiny/rl/model \
      --config.tasks.path=runs/swe_bar_tiny/tasks/instances.jsonl

Every other setting is the SWE main job's (configs/swe_bar.py, the variant given as the argument: ``tiny`` by
default), so the episodes sample as the main job's evaluations do: ``eval.samples`` sampled episodes a task at
``rl.rollout.temperature``, and the turn, token and context limits of ``rl.rollout``. The main job's training
settings are unused here.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from configs.swe_bar import get_config as swe_bar_config


def get_config(arg: str | None = None) -> ConfigDict:
    config = swe_bar_config(arg or "tiny")
    config.policy = ""  # a policy directory: a model (config.json, model.safetensors) and its tokenizer
    config.tasks.path = ""  # the instances (JSON list or JSONL), their repositories beside them
    return config
