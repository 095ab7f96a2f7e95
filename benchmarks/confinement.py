"""What the seccomp filter and no_new_privs cost a local sandbox: create-to-first-exec and exec, side by side,
and what a system call costs under the allow list against the deny list Orchard used before.

Two orchestrators run at once on this machine, the same code: one confines its sandboxes (the
default), one is started with ``--no-seccomp``. In each of ``rounds`` rounds, each orchestrator
creates ``creates`` sandboxes one after another and times ``client.create()`` until the first
``exec("true")`` returns (:func:`benchmarks.env.bench_orchard_create`), then ``iterations`` exec
calls in one sandbox; the order of the two alternates between rounds so that neither always runs
on a warmer machine. The ratio is confined over unconfined.

Per call (:func:`syscall_costs`): a fresh Python process loads no filter, the old deny list
(``build_filter(allow_unlisted=True)``) or the allow list, then times ``calls`` calls of each of
``getppid`` (the cheapest call: what the filter adds shows most), ``stat`` and a 4 KiB
``pread``; the variants alternate over ``rounds`` rounds and the best round counts, as
``timeit`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

from benchmarks.env import BenchConfig, bench_orchard_create, bench_orchard_exec, latency_stats, run_metadata
from orchard.env.local import local_server
from orchard.results import markdown_table

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"confined": (), "unconfined": ("--no-seccomp",)}
FILTERS = ("none", "deny list", "allow list")
CALLS = ("getppid", "stat", "pread 4 KiB")


def _time_calls(calls: int) -> dict[str, float]:
    """Nanoseconds per call of each of :data:`CALLS`, in this process (loop overhead included)."""
    fd = os.open("/proc/self/exe", os.O_RDONLY)
    bodies = {"getppid": os.getppid, "stat": lambda: os.stat("/"), "pread 4 KiB": lambda: os.pread(fd, 4096, 0)}
    costs = {}
    for name in CALLS:
        body = bodies[name]
        start = time.perf_counter_ns()
        for _ in range(calls):
            body()
        costs[name] = (time.perf_counter_ns() - start) / calls
    os.close(fd)
    return costs


def _costs_under(variant: str, calls: int) -> dict[str, float]:
    """:func:`_time_calls` in a fresh Python process that first loads ``variant``'s filter (a filter cannot be
    unloaded, and forking a process that runs JAX's threads is unsafe)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.confinement", variant, str(calls)], cwd=REPOSITORY,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"timing system calls under the {variant} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def syscall_costs(rounds: int = 5, calls: int = 200_000) -> dict[str, Any]:
    """Per filter and call, the best round's nanoseconds per call; per filter, its added cost over none."""
    best: dict[str, dict[str, float]] = {variant: {} for variant in FILTERS}
    for number in range(rounds):
        for variant in (FILTERS if number % 2 == 0 else tuple(reversed(FILTERS))):
            for name, cost in _costs_under(variant, calls).items():
                best[variant][name] = min(best[variant].get(name, cost), cost)
    added = {variant: {name: best[variant][name] - best["none"][name] for name in CALLS} for variant in FILTERS[1:]}
    return {"rounds": rounds, "calls": calls, "ns_per_call": best, "added_ns": added}


async def _round(servers: dict[str, Any], order: list[str], cfg: BenchConfig,
                 samples: dict[str, dict[str, list[float]]]) -> None:
    for name in order:
        async with servers[name].async_client() as client:
            samples[name]["create"] += await bench_orchard_create(client, cfg)
            samples[name]["exec"] += await bench_orchard_exec(client, cfg)


def run_confinement(cfg: BenchConfig, command: str | None = None,
                    syscall_calls: int = 200_000) -> dict[str, Any]:
    """The summary: per variant, create-to-first-exec and exec latency; the confined/unconfined ratios; the cost
    of one system call under each filter (:func:`syscall_costs`, ``syscall_calls`` calls a round)."""
    samples = {name: {"create": [], "exec": []} for name in VARIANTS}
    rounds = cfg.rounds
    per_round = replace(cfg, creates=max(1, cfg.creates // rounds), iterations=max(1, cfg.iterations // rounds))
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(local_server(extra_args=args)) for name, args in VARIANTS.items()}
        for number in range(rounds):
            order = list(VARIANTS) if number % 2 == 0 else list(reversed(VARIANTS))
            asyncio.run(_round(servers, order, per_round, samples))
    stats = {name: {kind: {**latency_stats(values), "n": len(values)} for kind, values in kinds.items()}
             for name, kinds in samples.items()}
    ratio = {kind: stats["confined"][kind]["p50_ms"] / stats["unconfined"][kind]["p50_ms"] for kind in ("create", "exec")}
    return {"metadata": {**run_metadata(cfg, command), "rounds": rounds}, "latency": stats, "ratio_p50": ratio,
            "syscalls": syscall_costs(calls=syscall_calls)}


def render_confinement(summary: dict[str, Any]) -> str:
    stats, ratio = summary["latency"], summary["ratio_p50"]
    rows = [(label, f"{stats['confined'][kind]['p50_ms']:.1f} / {stats['confined'][kind]['p99_ms']:.1f}",
             f"{stats['unconfined'][kind]['p50_ms']:.1f} / {stats['unconfined'][kind]['p99_ms']:.1f}",
             f"{ratio[kind]:.2f}")
            for kind, label in (("create", "create to first exec"), ("exec", "exec `true`"))]
    meta = summary["metadata"]
    return "\n".join([
        "### Confinement: no_new_privs and the seccomp filter",
        "",
        f"Measured {meta['timestamp'][:10]} on {meta['cpu_count']} cores: `{meta['command']}`. Two "
        "orchestrators of the same code side by side, one started with `--no-seccomp`, alternating over "
        f"{meta['rounds']} rounds (`benchmarks/confinement.py`). Milliseconds, p50 / p99.",
        "",
        markdown_table(["", "confined (default)", "`--no-seccomp`", "ratio (p50)"], rows,
                       [None, "right", "right", "right"]),
        "",
        _render_syscalls(summary["syscalls"]),
    ])


def _render_syscalls(costs: dict[str, Any]) -> str:
    per_call, added = costs["ns_per_call"], costs["added_ns"]
    rows = [(name, f"{per_call['none'][name]:.0f}",
             *(f"{per_call[variant][name]:.0f} ({added[variant][name]:+.0f})" for variant in FILTERS[1:]))
            for name in CALLS]
    return "\n".join([
        f"One system call from Python under each filter, nanoseconds (the best of {costs['rounds']} rounds of "
        f"{costs['calls']:,} calls, loop included; in brackets, what the filter adds). The allow list is the "
        "default; the deny list is the filter Orchard loaded before it.",
        "",
        markdown_table(["call", "no filter", "deny list", "allow list (default)"], rows,
                       [None, "right", "right", "right"]),
    ])


if __name__ == "__main__":  # one variant's costs, for _costs_under: python -m benchmarks.confinement VARIANT CALLS
    from orchard.env.agent.confine import build_filter, confine

    if sys.argv[1] != "none":
        confine(build_filter(allow_unlisted=sys.argv[1] == "deny list"))
    print(json.dumps(_time_calls(int(sys.argv[2]))))
