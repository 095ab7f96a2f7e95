"""Benchmark Orchard Env exec and create latency against SWE-ReX and a host subprocess.

A thin wrapper over :mod:`benchmarks.env` (which documents what is measured). Prints the JSON
summary to stdout, writes it to ``--out``, and with ``--markdown PATH`` renders it as a Markdown page.
Needs root: orchard sandboxes use Linux namespaces.

    python experiments/env_bench/run.py --markdown docs/benchmarks.md
    python experiments/env_bench/run.py --stress 1000 --markdown docs/benchmarks.md
    python experiments/env_bench/run.py --soak 10 --markdown docs/benchmarks.md

``--confinement`` times sandboxes with and without the seccomp filter side by side
(:mod:`benchmarks.confinement`, ``results/confinement.json``); ``--ports`` times a request and a WebSocket
round trip through a port forward against exec (:mod:`benchmarks.ports`, ``results/ports.json``). ``--stress N`` and ``--soak MINUTES`` run the scale checks of :mod:`benchmarks.env_scale` instead of
the latency comparison, and write ``results/stress.json`` or ``results/soak.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import sys
from pathlib import Path

from orchard.env import local_server

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/ is not installed
from benchmarks.confinement import render_confinement, run_confinement
from benchmarks.env import BenchConfig, render_markdown, run_benchmark
from benchmarks.env_scale import fork_and_claim, render_soak, render_stress, soak, stress
from benchmarks.ports import render_ports, run_ports
from orchard.results import publish

DEFAULT_OUT = Path(__file__).parent / "results" / "summary.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; the defaults are those of :class:`BenchConfig`."""
    defaults = BenchConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=defaults.iterations, help="timed exec calls per backend")
    parser.add_argument("--warmup", type=int, default=defaults.warmup, help="untimed exec calls before those")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency,
                        help="orchard sandboxes busy at once")
    parser.add_argument("--per-sandbox", type=int, default=defaults.per_sandbox,
                        help="exec calls each busy sandbox makes")
    parser.add_argument("--creates", type=int, default=defaults.creates,
                        help="sandboxes created one at a time for create latency")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON summary")
    parser.add_argument("--markdown", type=Path, help="also render the summary as Markdown to this path")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--stress", type=int, metavar="N", help="N concurrent sandboxes, 4 commands each, "
                        "then fork and warm-pool latency")
    parser.add_argument("--soak", type=float, metavar="MINUTES", help="create/exec/delete churn; report leaks")
    parser.add_argument("--confinement", action="store_true",
                        help="create-to-first-exec and exec with and without the seccomp filter, side by side")
    parser.add_argument("--ports", action="store_true",
                        help="an HTTP request and a WebSocket round trip through a port forward, against exec")
    args = parser.parse_args(argv)
    for name in ("iterations", "concurrency", "per_sandbox", "creates"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and write its outputs."""
    args = parse_args(argv)
    command = shlex.join(["python", "experiments/env_bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    if args.stress or args.soak:
        run_scale(args, command)
        return
    cfg = BenchConfig(iterations=args.iterations, warmup=args.warmup, concurrency=args.concurrency,
                      per_sandbox=args.per_sandbox, creates=args.creates, progress=not args.no_progress)
    if args.confinement:
        publish(run_confinement(cfg, command=command), args.out.with_name("confinement.json"), args.markdown,
                "env_confinement", render_confinement)
        return
    if args.ports:
        publish(run_ports(cfg, command=command), args.out.with_name("ports.json"), args.markdown, "env_ports",
                render_ports)
        return
    publish(run_benchmark(cfg, command=command), args.out, args.markdown, "env_bench", render_markdown)


def run_scale(args: argparse.Namespace, command: str) -> None:
    """``--stress`` and ``--soak``: each against a fresh orchestrator."""
    base = {"command": command, "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    if args.stress:
        with local_server() as server:
            summary = {**base, "stress": asyncio.run(stress(server, args.stress, progress=not args.no_progress))}
            summary["fork_and_claim"] = asyncio.run(fork_and_claim(server))
        publish(summary, args.out.with_name("stress.json"), args.markdown, "env_stress", render_stress)
    if args.soak:
        with local_server() as server:
            summary = {**base, "soak": asyncio.run(soak(server, args.soak, progress=not args.no_progress))}
        publish(summary, args.out.with_name("soak.json"), args.markdown, "env_soak", render_soak)


if __name__ == "__main__":
    main()
