"""The SWE evaluation entry point: any policy directory on any instance file, greedy and sampled, with the
main job's metrics and folders; and what it refuses before starting."""

from __future__ import annotations

import json
import os

import pytest
from flax import nnx
from rich.console import Console

from configs.swe_eval import get_config
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import read_trajectories
from orchard.models import ModelConfig, Transformer, save_pretrained
from orchard.recipes.report import summary_table
from orchard.recipes.runner import eval_directory
from orchard.recipes.stages import episodes_path
from orchard.recipes.swe import SWE
from orchard.recipes.swe_eval import EVAL_SET, STAGE, check, run_eval
from orchard.tasks.swe.instance import save_instances
from orchard.tasks.swe.skills import ProceduralConfig
from orchard.tasks.swe.taskset import TaskSetConfig, make_task_set


@pytest.fixture(scope="module")
def policy_and_tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("swe_eval")
    config = TaskSetConfig(sources=("procedural",), kinds=("swap_operator",),
                           procedural=ProceduralConfig(repos=1, helpers=6, bugs_per_repo=2, held_out_repos=0))
    instances = make_task_set(config, str(root / "generated"), seed=0)
    save_instances(instances, str(root / "instances.jsonl"))  # the file names the repositories beside it
    tokenizer = Tokenizer.train([i.problem_statement for i in instances] * 5, 300)
    policy = str(root / "policy")
    save_pretrained(Transformer(ModelConfig.tiny(tokenizer.vocab_size), rngs=nnx.Rngs(0)), policy)
    tokenizer.save_pretrained(policy)
    return policy, str(root / "instances.jsonl"), len(instances)


def _config(policy: str, path: str, orchestrator):
    config = get_config()
    config.update({"policy": policy})
    config.tasks.path = path
    config.eval.samples = 2
    config.rl.rollout.update({"max_turns": 2, "max_new_tokens": 16, "concurrency": 2})
    config.env.update({"url": orchestrator.base_url, "api_key": orchestrator.api_key})
    return config


def test_a_policy_is_evaluated_greedy_and_sampled_with_the_main_jobs_metrics(policy_and_tasks, orchestrator, tmp_path):
    policy, path, count = policy_and_tasks
    config = _config(policy, path, orchestrator)
    assert check(config) == []
    result = run_eval(config, str(tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == result.to_dict() and summary["tasks"][EVAL_SET] == count
    passes = summary["held_out"][EVAL_SET]["bash"][STAGE]
    assert set(passes) == {"greedy", "sampled"}
    for pass_, samples in (("greedy", 1), ("sampled", 2)):
        assert passes[pass_]["episodes"] == count * samples and 0.0 <= passes[pass_]["resolve_rate"] <= 1.0
        folder = eval_directory(str(tmp_path), EVAL_SET, "bash", STAGE, pass_)
        episodes = list(read_trajectories(episodes_path(folder)))
        assert len(episodes) == count * samples and all(e.outcome.resolved is not None for e in episodes)
    assert run_eval(config, str(tmp_path)).to_dict()["held_out"] == summary["held_out"]  # reused, not rerun
    console = Console(width=200, record=True)
    console.print(summary_table(result, SWE.measures))
    rows = [line for line in console.export_text().splitlines() if f" {STAGE} " in line]
    assert len(rows) == 2 and any("greedy" in row for row in rows)  # the stage the main job has not, by name


def test_what_it_cannot_evaluate_is_named_before_it_starts(orchestrator, tmp_path):
    problems = "\n".join(check(_config("", "", orchestrator)))
    assert "--config.policy=DIR" in problems and "--config.tasks.path=FILE" in problems
    os.makedirs(tmp_path / "empty")
    problems = "\n".join(check(_config(str(tmp_path / "empty"), str(tmp_path / "missing.jsonl"), orchestrator)))
    assert "is not a policy directory" in problems and "does not exist" in problems
