"""RL benchmark: rollout throughput at 8, 32 and 64 concurrent sandboxes, and BAR against fixed-N
GRPO and dynamic filtering at equal rollout budget.

    python experiments/rl_bench/run.py                  # writes experiments/rl_bench/results/summary.json

Throughput is of whole RL rollouts through :class:`orchard.train.rl.RolloutWorkers` over
:class:`~orchard.tasks.swe.task.SWETask`: a fresh sandbox, the task's repository set up in it, the
bash harness, SWE-bench grading, the sandbox deleted. The policy is the oracle teacher (brief plan: search, read, edit, submit), so the figure
is the environment's side of RL, which a model's generation time adds to. The sampler comparison
runs :func:`benchmarks.bar_sim.simulate` on three simulated pass-rate distributions. Needs root
(sandboxes use Linux namespaces).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time

from absl import app, flags
from tqdm import tqdm

from benchmarks.bar_sim import pass_rate_distributions, simulate
from benchmarks.cli import define_integers, flags_only, integers
from orchard.env import AsyncSandboxClient, local_server
from orchard.harness.bash import BashHarness
from orchard.harness.core import Limits
from orchard.harness.episode import EpisodeRunner
from orchard.tasks.swe.generate import generate_task_set
from orchard.tasks.swe.oracle import OracleTeacher
from orchard.tasks.swe.sources import resolve_source
from orchard.tasks.swe.task import swe_tasks
from orchard.train.bar import BAR, DynamicFilter, FixedGroup
from orchard.train.rl import RolloutWorkers
from orchard.workdir import write_json

define_integers("levels", [8, 32, 64], "concurrent sandboxes to measure")
flags.DEFINE_integer("per_level", 2, "rollouts per level, as a multiple of the level", lower_bound=1)
flags.DEFINE_integer("tasks", 16, "synthetic tasks the rollouts cycle over", lower_bound=1)
flags.DEFINE_integer("budget", 8000, "simulated rollouts per sampler", lower_bound=1)
flags.DEFINE_string("out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "summary.json"),
                    "where to write the JSON summary")
FLAGS = flags.FLAGS


class OraclePolicy:
    """The oracle teacher of whichever task an episode is on (the statement names it)."""

    name = "oracle-brief"

    def __init__(self, instances) -> None:
        self.by_statement = {i.problem_statement: i for i in instances}

    async def act(self, conversation, *, max_context=None):
        task = next(i for text, i in self.by_statement.items() if text in conversation.messages[1].content)
        return await OracleTeacher(task, "bash", brief=True).act(conversation, max_context=max_context)


async def throughput(levels: list[int], per_level: int, tasks: int) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as scratch:
        instances, _ = generate_task_set([resolve_source("opkit")], tasks, scratch, seed=0, tests_visible=True)
        results = []
        with local_server() as server:
            client = AsyncSandboxClient(server.base_url, api_key=server.api_key)
            try:
                tasks_ = swe_tasks(instances)
                for level in levels:
                    runner = EpisodeRunner(client, BashHarness(), OraclePolicy(instances), concurrency=level,
                                           limits=Limits(max_turns=8), episode_seconds=600)
                    workers = RolloutWorkers(runner, seed=0)
                    count = per_level * level
                    bar = tqdm(total=count, desc=f"{level} sandboxes", unit="rollout")

                    async def one(index: int, workers=workers, bar=bar, level=level):
                        [rollout] = await workers.rollouts(tasks_[index % len(tasks_)], level, index, 1)
                        bar.update()
                        return rollout

                    started = time.perf_counter()
                    rollouts = await asyncio.gather(*(one(i) for i in range(count)))
                    seconds = time.perf_counter() - started
                    bar.close()
                    results.append({"concurrent_sandboxes": level, "rollouts": count, "seconds": seconds,
                                     "trajectories_per_minute": 60.0 * count / seconds,
                                     "resolved": sum(r.reward == 1.0 for r in rollouts),
                                     "dropped": sum(r.reward is None for r in rollouts)})
            finally:
                await client.aclose()
        return results


def samplers(budget: int, prompts: int) -> dict[str, dict[str, dict[str, float]]]:
    """Each sampler on each simulated distribution, at the paper's N = 8 and equal budget."""
    kinds = {"bar (paper: N_max 16, stride 16)": lambda: BAR(8, 16, 16, 0.375, 0.625),
             "bar (stride 8)": lambda: BAR(8, 16, 8, 0.375, 0.625),
             "fixed-N GRPO": lambda: FixedGroup(8), "dynamic filtering": lambda: DynamicFilter(8)}
    return {dist: {name: simulate(make(), rates, budget, seed=1) for name, make in kinds.items()}
            for dist, rates in pass_rate_distributions(prompts, seed=0).items()}


def main(argv: list[str]) -> None:
    flags_only(argv)
    summary = {"samplers_at_equal_budget": samplers(FLAGS.budget, 400),
               "rollout_throughput": asyncio.run(throughput(list(integers("levels")), FLAGS.per_level, FLAGS.tasks))}
    write_json(FLAGS.out, summary)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    app.run(main)
