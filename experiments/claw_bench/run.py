"""Benchmark Claw's tool services in Orchard Env: set-up, a tool call through the port forward against the
same services on the host's loopback and in process, and rollouts per minute at 4, 16 and 64 sandboxes.

A thin wrapper over :mod:`benchmarks.claw` (which documents what is measured). Writes the JSON summary to
``--out`` and, with ``--markdown PATH``, its section of that page. Needs root (sandboxes).

    python experiments/claw_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/ is not installed
from benchmarks.claw import render_claw_bench, run_claw_bench
from benchmarks.env import BenchConfig
from orchard.results import publish


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=300, help="timed rounds of tool calls")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--starts", type=int, default=10, help="fresh set-ups timed")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--seconds", type=float, default=60.0, help="wall time of each rollouts-per-minute run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "summary.json")
    parser.add_argument("--markdown", type=Path, help="also write its section of this Markdown page")
    args = parser.parse_args(argv)
    if args.iterations < 2 or args.starts < 1 or args.seconds <= 0 or min(args.concurrency) < 1:
        parser.error("--iterations at least 2, --starts at least 1, --seconds positive, --concurrency at least 1")
    command = shlex.join(["python", "experiments/claw_bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    cfg = BenchConfig(iterations=args.iterations, warmup=args.warmup, progress=False)
    summary = run_claw_bench(cfg, args.starts, tuple(args.concurrency), args.seconds, command)
    publish(summary, args.out, args.markdown, "claw_bench", render_claw_bench)


if __name__ == "__main__":
    main()
