"""Collect teacher trajectories for Orchard-SWE: tasks x harnesses x k samples in real sandboxes.

    python experiments/swe_collect/run.py --tasks experiments/swe_tasks/results/shipped/instances.jsonl
    python experiments/swe_collect/run.py --tasks T.jsonl --teacher http://127.0.0.1:8000/v1 --model M

With no ``--teacher`` the oracle teacher plays (``orchard.tasks.swe.oracle``: it knows the gold
patch; samples cycle through its clean, wandering and failing variants). With ``--teacher`` any
OpenAI-compatible endpoint (``orchard serve``, vLLM, a hosted API) is the teacher. Starts a local
orchestrator unless ``--env URL --api-key K`` names one. Writes ``trajectories.jsonl`` and
``summary.json`` under ``--out`` and prints the summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from pathlib import Path

from orchard.data.trajectory import TrajectoryWriter
from orchard.env import AsyncSandboxClient, local_server
from orchard.harness.bash import BashHarness
from orchard.harness.codeact import CodeActHarness
from orchard.harness.core import Limits
from orchard.harness.policies import OpenAIChatPolicy
from orchard.tasks.swe.collect import collect
from orchard.tasks.swe.instance import load_instances
from orchard.tasks.swe.oracle import OracleTeacher

VARIANTS = ("clean", "wander", "fail")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", required=True, type=Path, help="instances.jsonl (experiments/swe_tasks/run.py)")
    parser.add_argument("--harnesses", default="bash,codeact")
    parser.add_argument("--samples", type=int, default=3, help="samples per task and harness")
    parser.add_argument("--teacher", help="an OpenAI-compatible base URL (default: the oracle teacher)")
    parser.add_argument("--model", default="teacher")
    parser.add_argument("--api-key", default="EMPTY")
    parser.add_argument("--env", help="an orchestrator URL (default: start a local one)")
    parser.add_argument("--env-key", help="the orchestrator's API key")
    parser.add_argument("--concurrency", type=int, default=4, help="sandboxes at once")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=None, help="context budget per trajectory (the filter)")
    parser.add_argument("--out", type=Path, default=Path("runs/swe_collect"))
    return parser.parse_args(argv)


def make_teacher(args: argparse.Namespace):
    if args.teacher:
        policy = OpenAIChatPolicy(args.teacher, args.model, api_key=args.api_key)
        return lambda instance, harness, k: policy
    return lambda instance, harness, k: OracleTeacher(instance, harness, VARIANTS[k % len(VARIANTS)], seed=k)


async def run(args: argparse.Namespace, base_url: str, key: str) -> dict:
    harnesses = {"bash": BashHarness, "codeact": CodeActHarness}
    chosen = [harnesses[name]() for name in args.harnesses.split(",")]
    client = AsyncSandboxClient(base_url, api_key=key)
    try:
        report = await collect(client, load_instances(args.tasks), chosen, make_teacher(args), args.samples,
                               limits=Limits(max_steps=args.max_steps, max_tokens=args.max_tokens),
                               concurrency=args.concurrency)
    finally:
        await client.aclose()
    args.out.mkdir(parents=True, exist_ok=True)
    with TrajectoryWriter(str(args.out / "trajectories.jsonl")) as writer:
        for trajectory in report.kept:
            writer.write(trajectory)
    summary = report.summary()
    (args.out / "summary.json").write_text(json.dumps({**summary, "errors": report.errors}, indent=2))
    return summary


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.env:
            base_url, key = args.env, args.env_key
        else:
            server = stack.enter_context(local_server())
            base_url, key = server.base_url, server.api_key
        summary = asyncio.run(run(args, base_url, key))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
