"""Collect teacher trajectories for Orchard-SWE: tasks x harnesses x k samples in real sandboxes.

    python experiments/swe_collect/run.py --tasks experiments/swe_tasks/results/shipped/instances.jsonl
    python experiments/swe_collect/run.py --tasks T.jsonl --teacher http://127.0.0.1:8000/v1 --model M

With no ``--teacher`` the oracle teacher plays (``orchard.tasks.swe.oracle``: it knows the gold
patch; samples cycle through its clean, wandering and failing variants). With ``--teacher`` any
OpenAI-compatible endpoint (``orchard serve``, vLLM, a hosted API) is the teacher. Starts a local
orchestrator unless ``--env URL --env_key K`` names one. Writes ``trajectories.jsonl`` and
``summary.json`` under ``--out`` and prints the summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

from absl import app, flags

from orchard.data.trajectory import TrajectoryWriter
from orchard.env import AsyncSandboxClient, local_server
from orchard.harness.bash import BashHarness
from orchard.harness.codeact import CodeActHarness
from orchard.harness.core import DEFAULT_MAX_TURNS, Limits
from orchard.harness.policies import OpenAIChatPolicy
from orchard.tasks.swe.collect import collect
from orchard.tasks.swe.instance import load_instances
from orchard.tasks.swe.oracle import OracleTeacher
from orchard.tasks.swe.task import swe_tasks

VARIANTS = ("clean", "wander", "fail")


flags.DEFINE_string("tasks", None, "instances.jsonl (experiments/swe_tasks/run.py)", required=True)
flags.DEFINE_list("harnesses", ["bash", "codeact"], "harnesses, comma-separated")
flags.register_validator("harnesses", lambda names: bool(names) and set(names) <= {"bash", "codeact"},
                         "--harnesses: bash, codeact or both, comma-separated")
flags.DEFINE_integer("samples", 3, "samples per task and harness", lower_bound=1)
flags.DEFINE_string("teacher", None, "an OpenAI-compatible base URL (default: the oracle teacher)")
flags.DEFINE_string("model", "teacher", "the teacher's model name at that URL")
flags.DEFINE_string("api_key", "EMPTY", "the teacher's API key")
flags.DEFINE_string("env", None, "an orchestrator URL (default: start a local one)")
flags.DEFINE_string("env_key", None, "the orchestrator's API key")
flags.DEFINE_integer("concurrency", 4, "sandboxes at once", lower_bound=1)
flags.DEFINE_integer("max_turns", DEFAULT_MAX_TURNS, "policy turns per trajectory", lower_bound=1)
flags.DEFINE_integer("max_tokens", None, "context budget per trajectory (the filter)", lower_bound=1)
flags.DEFINE_string("out", "runs/swe_collect", "where trajectories.jsonl and summary.json go")
FLAGS = flags.FLAGS


def make_teacher():
    if FLAGS.teacher:
        policy = OpenAIChatPolicy(FLAGS.teacher, FLAGS.model, api_key=FLAGS.api_key)
        return lambda instance, harness, k: policy
    return lambda instance, harness, k: OracleTeacher(instance, harness, VARIANTS[k % len(VARIANTS)], seed=k)


async def run(base_url: str, key: str) -> dict:
    harnesses = {"bash": BashHarness, "codeact": CodeActHarness}
    chosen = [harnesses[name]() for name in FLAGS.harnesses]
    client = AsyncSandboxClient(base_url, api_key=key)
    try:
        report = await collect(client, swe_tasks(load_instances(FLAGS.tasks)), chosen, make_teacher(), FLAGS.samples,
                               limits=Limits(max_turns=FLAGS.max_turns, max_tokens=FLAGS.max_tokens),
                               concurrency=FLAGS.concurrency)
    finally:
        await client.aclose()
    out = Path(FLAGS.out)
    out.mkdir(parents=True, exist_ok=True)
    with TrajectoryWriter(str(out / "trajectories.jsonl")) as writer:
        for trajectory in report.kept:
            writer.write(trajectory)
    summary = report.summary()
    (out / "summary.json").write_text(json.dumps({**summary, "errors": report.errors}, indent=2))
    return summary


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}: every option is a flag")
    with contextlib.ExitStack() as stack:
        if FLAGS.env:
            base_url, key = FLAGS.env, FLAGS.env_key
        else:
            server = stack.enter_context(local_server())
            base_url, key = server.base_url, server.api_key
        summary = asyncio.run(run(base_url, key))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    app.run(main)
