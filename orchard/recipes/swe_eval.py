"""Evaluate any policy directory on any SWE-bench-format instance file, as the main job evaluates its
stages: greedy (one episode a task at T = 0) and sampled (``eval.samples`` a task at the rollouts'
temperature), in the bash harness, in real sandboxes, with the same metrics, folders and table.

``experiments/swe_eval/run.py --config.policy=runs/swe_bar_tiny/rl/model --config.tasks.path=FILE``
evaluates the RL policy of a main job on ``FILE``'s instances (their repositories beside it, as
:func:`orchard.tasks.swe.instance.load_instances` reads them). The policy directory holds a model
(``config.json`` and weights, :func:`orchard.models.save_pretrained`) and its tokenizer; every one the
recipes write does. Everything else is read from the config (``configs/swe_eval.py``: the main job's
settings, so an evaluation here and there sample alike).
"""

from __future__ import annotations

import asyncio
import os

from ml_collections import ConfigDict

from orchard.config import fingerprint
from orchard.data.tokenizer import Tokenizer
from orchard.models.shipped import resolve
from orchard.recipes.family import Split
from orchard.recipes.runner import RecipeResult, evaluate, open_run
from orchard.recipes.stages import Clock, trained_policy
from orchard.recipes.swe import SWE, tasks_fingerprint
from orchard.tasks.swe.instance import load_instances
from orchard.tasks.swe.task import swe_tasks
from orchard.workdir import file_fingerprint, write_json

EVAL_SET = "eval"  # the one set: every instance of the file
STAGE = "policy"  # the evaluated policy, where the main job has init, sft and rl


def check(config: ConfigDict) -> list[str]:
    """The main job's checks, and a policy directory with a model and a tokenizer, and an instance file."""
    problems = SWE.check_config(config)
    policy = config.get("policy", "")
    if not policy:
        problems.append("policy: name the policy directory to evaluate (--config.policy=DIR)")
    elif not all(os.path.exists(os.path.join(resolve(policy), name)) for name in ("config.json", "model.safetensors",
                                                                                  "tokenizer.json")):
        problems.append(f"policy: {policy!r} is not a policy directory (config.json, model.safetensors and "
                        "tokenizer.json); a recipe writes one in <workdir>/rl/model")
    if not config.tasks.path:
        problems.append("tasks.path: name the instances to evaluate on (--config.tasks.path=FILE)")
    elif not os.path.exists(config.tasks.path):
        problems.append(f"tasks.path: {config.tasks.path!r} does not exist")
    return problems


async def evaluate_swe_policy(config: ConfigDict, workdir: str, *, rerun: bool = False) -> RecipeResult:
    """Both passes of ``config.policy`` on ``config.tasks.path``; ``summary.json`` in ``workdir``."""
    clock = Clock()
    policy_dir = resolve(config.policy)
    async with open_run(SWE, config, workdir, rerun) as ctx:
        instances = load_instances(ctx.settings.tasks.path)
        split = Split(sft=[], rl=[], held_out={EVAL_SET: swe_tasks(instances, repair_tool=ctx.settings.tasks.repair_tool)},
                      made_by=tasks_fingerprint(file_fingerprint(ctx.settings.tasks.path), ctx.settings.tasks))
        policy_made_by = file_fingerprint(os.path.join(policy_dir, "model.safetensors"))  # its weights' bytes
        held = await evaluate(SWE, ctx, workdir, split, STAGE, ("greedy", "sampled"),
                              trained_policy(ctx.settings, policy_dir, ctx.mesh), Tokenizer.from_pretrained(policy_dir),
                              policy_made_by)
        clock.lap("evaluate")
    result = RecipeResult(family=SWE.name, config_digest=fingerprint(config.to_dict()), tasks=split.counts(),
                          teacher={}, held_out=held, changes={}, rl_metrics={}, seconds=clock.seconds,
                          extras={"policy": policy_dir, "instances": ctx.settings.tasks.path})
    write_json(os.path.join(workdir, "summary.json"), result.to_dict())
    return result


def run_eval(config: ConfigDict, workdir: str, *, rerun: bool = False) -> RecipeResult:
    """:func:`evaluate_swe_policy` from synchronous code."""
    return asyncio.run(evaluate_swe_policy(config, workdir, rerun=rerun))
