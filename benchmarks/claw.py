"""What Claw's tool services cost: starting them, a tool call through Orchard Env, episodes per minute.

In one run, on one local orchestrator:

- **service start**: a fresh sandbox's set-up of a Claw task (package upload, config, the services
  process started and healthy, the tools file and the CLIs), and the set-up of a pooled sandbox whose
  services are already running (a reset over the admin route and the workspace rewritten);
- **a tool call** (``GET /mail/messages``) three ways, alternating in rounds: through the sandbox's
  port forward (:meth:`~orchard.env.client.AsyncSandbox.port_request`: orchestrator, agent, services),
  to the same services run as a plain process on the host's loopback (Claw-Eval's setting: the harness
  calls its services directly), and in process (httpx over ASGI, no network at all);
- **rollouts per minute** of the ReAct harness replaying each task's reference plan
  (:class:`~orchard.tasks.claw.oracle.PlanPolicy`) at 4, 16 and 64 concurrent sandboxes, each episode
  set up, run and graded, sandboxes pooled between episodes (the first episode of each pays the start).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx

from benchmarks.env import BenchConfig, latency_stats, run_metadata
from orchard.env.client import AsyncSandboxClient
from orchard.env.local import free_port, local_server
from orchard.harness.claw import ClawHarness
from orchard.harness.episode import SandboxPool, run_episode
from orchard.results import markdown_table
from orchard.tasks.claw.generate import generate_tasks
from orchard.tasks.claw.oracle import PlanPolicy
from orchard.tasks.claw.services import PACKAGE_DIR, SANDBOX_NAME, create_app
from orchard.tasks.claw.task import SERVICES_PORT, ClawTask

TOKEN = "bench-token"
PATH = "/mail/messages"


async def bench_start(client: AsyncSandboxClient, tasks: list[ClawTask], n: int) -> dict[str, list[float]]:
    """Set-up seconds in fresh sandboxes, and again in the same sandboxes (the pooled reset)."""
    fresh, reset = [], []
    for index in range(n):
        task = tasks[index % len(tasks)]
        async with client.create(**task.family.sandbox) as box:
            started = time.perf_counter()
            await task.setup(box)
            fresh.append(time.perf_counter() - started)
            started = time.perf_counter()
            await tasks[(index + 1) % len(tasks)].setup(box)
            reset.append(time.perf_counter() - started)
    return {"fresh": fresh, "reset": reset}


@contextlib.asynccontextmanager
async def host_services(config: dict[str, Any]) -> AsyncIterator[str]:
    """The services as a plain process on the host's loopback (the peer's setting); their base URL."""
    with tempfile.TemporaryDirectory(prefix="orchard-claw-bench-") as root:
        shutil.copytree(PACKAGE_DIR, os.path.join(root, SANDBOX_NAME), ignore=shutil.ignore_patterns("__pycache__"))
        config_path, token_path = os.path.join(root, "config.json"), os.path.join(root, "token")
        with open(config_path, "w") as handle:
            json.dump(config, handle)
        with open(token_path, "w") as handle:
            handle.write(TOKEN)
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", SANDBOX_NAME, "--port", str(port), "--config", config_path,
                                    "--admin-token-file", token_path], env={**os.environ, "PYTHONPATH": root},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient() as http:
                for _ in range(600):
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"{url}/health")).status_code == 200:
                            break
                    await asyncio.sleep(0.02)
            yield url
        finally:
            process.terminate()
            process.wait(10)


async def bench_calls(client: AsyncSandboxClient, task: ClawTask, cfg: BenchConfig) -> dict[str, list[float]]:
    """One tool call three ways, alternating so that drift in the machine's load hits all alike."""
    samples: dict[str, list[float]] = {"env_port_forward": [], "host_loopback": [], "in_process": []}
    app = create_app(task.spec.services_config(), TOKEN)
    async with (client.create(**task.family.sandbox) as box, host_services(task.spec.services_config()) as url,
                aiohttp.ClientSession() as direct,
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://services") as local):
        await task.setup(box)

        async def through_env() -> None:
            assert (await box.port_request(SERVICES_PORT, "GET", PATH)).status == 200

        async def on_loopback() -> None:
            async with direct.get(url + PATH) as reply:
                assert reply.status == 200
                await reply.read()

        async def in_process() -> None:
            assert (await local.get(PATH)).status_code == 200

        calls = {"env_port_forward": through_env, "host_loopback": on_loopback, "in_process": in_process}
        for round_ in range(cfg.warmup + cfg.iterations):
            for name, call in calls.items():
                started = time.perf_counter()
                await call()
                if round_ >= cfg.warmup:
                    samples[name].append(time.perf_counter() - started)
    return samples


async def bench_rollouts(client: AsyncSandboxClient, tasks: list[ClawTask], concurrency: int,
                         seconds: float) -> dict[str, float]:
    """Reference-plan episodes for ``seconds`` at ``concurrency`` sandboxes (pooled); per minute."""
    harness, done, solved = ClawHarness(), 0, 0
    deadline = time.monotonic() + seconds
    async with SandboxPool(concurrency) as pool:
        async def worker(lane: int) -> None:
            nonlocal done, solved
            index = lane
            while time.monotonic() < deadline:
                task = tasks[index % len(tasks)]
                trajectory = await run_episode(client, harness, PlanPolicy(task.spec.reference_plan), task,
                                               seed=index, pool=pool)
                done += 1
                solved += trajectory.outcome.reward == 1.0
                index += concurrency

        started = time.monotonic()
        await asyncio.gather(*(worker(lane) for lane in range(concurrency)))
        elapsed = time.monotonic() - started
    return {"concurrency": concurrency, "episodes": done, "solved": solved, "seconds": round(elapsed, 1),
            "per_minute": round(60 * done / elapsed, 1)}


async def _run(cfg: BenchConfig, tasks: list[ClawTask], starts: int, concurrency: tuple[int, ...],
               seconds: float) -> dict[str, Any]:
    server = local_server()
    client = server.async_client()
    try:
        start = await bench_start(client, tasks, starts)
        calls = await bench_calls(client, tasks[0], cfg)
        rollouts = [await bench_rollouts(client, tasks, c, seconds) for c in concurrency]
    finally:
        await client.aclose()
        server.stop()
    return {"start": start, "calls": calls, "rollouts": rollouts}


def run_claw_bench(cfg: BenchConfig, starts: int, concurrency: tuple[int, ...], seconds: float,
                   command: str | None = None) -> dict[str, Any]:
    tasks = [ClawTask(spec) for spec in generate_tasks(4).train]  # every family, two tasks each
    raw = asyncio.run(_run(cfg, tasks, starts, concurrency, seconds))
    calls = {name: latency_stats(values) for name, values in raw["calls"].items()}
    return {
        "setup_fresh": latency_stats(raw["start"]["fresh"]), "setup_pooled_reset": latency_stats(raw["start"]["reset"]),
        "tool_call": calls,
        "tool_call_p50_ratio_env_over_loopback": round(calls["env_port_forward"]["p50_ms"]
                                                       / calls["host_loopback"]["p50_ms"], 2),
        "tool_call_p50_ratio_env_over_in_process": round(calls["env_port_forward"]["p50_ms"]
                                                         / calls["in_process"]["p50_ms"], 2),
        "rollouts": raw["rollouts"], "metadata": {**run_metadata(cfg, command), "starts": starts,
                                                   "rollout_seconds": seconds},
    }


def render_claw_bench(summary: dict[str, Any]) -> str:
    calls = summary["tool_call"]
    paths = [("through Orchard Env's port forward", "env_port_forward"),
             ("the same services on the host's loopback (Claw-Eval's setting)", "host_loopback"),
             ("in process (ASGI, no network)", "in_process")]
    call_table = markdown_table(["path", "p50 ms", "p99 ms"],
                                [(label, str(calls[key]["p50_ms"]), str(calls[key]["p99_ms"])) for label, key in paths])
    rollout_table = markdown_table(
        ["sandboxes", "episodes", "per minute"],
        [(r["concurrency"], f"{r['episodes']} ({r['solved']} solved) in {r['seconds']} s", str(r["per_minute"]))
         for r in summary["rollouts"]])
    meta = summary["metadata"]
    return f"""## Claw tool services (`experiments/claw_bench/run.py`)

Measured {meta['timestamp']} on {meta['cpu_count']} cores (`{meta['command']}`). Set-up of a Claw task in a sandbox,
p50 / p99 over {meta['starts']}: fresh (upload, services started and healthy, tools file, CLIs)
{summary['setup_fresh']['p50_ms']:.0f} / {summary['setup_fresh']['p99_ms']:.0f} ms; pooled (reset over the admin route,
workspace rewritten) {summary['setup_pooled_reset']['p50_ms']:.0f} / {summary['setup_pooled_reset']['p99_ms']:.0f} ms.

A tool call (`GET /mail/messages`), p50 / p99 over {meta['config']['iterations']} rounds:

{call_table}

The port forward costs {summary['tool_call_p50_ratio_env_over_loopback']}x a direct loopback call
({summary['tool_call_p50_ratio_env_over_in_process']}x an in-process one), the price of isolation.

Reference-plan episodes of the ReAct harness (set up, run, graded; sandboxes pooled) for
{meta['rollout_seconds']:g} s at each concurrency. Each count includes its sandboxes' first set-up (a services
process started per sandbox, all at once), so with more sandboxes than cores more of the minute goes to
starting them; an episode's own work (a few tool calls, the tests) takes a fraction of a second:

{rollout_table}
"""
