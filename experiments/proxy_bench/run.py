"""Benchmark the recording proxy's added latency against calling the upstream directly and LiteLLM's proxy.

A thin wrapper over :mod:`benchmarks.proxy` (which documents what is measured). Writes the JSON
summary to ``--out`` and, with ``--markdown PATH``, its section of that page.

    python experiments/proxy_bench/run.py --markdown docs/benchmarks.md --litellm .venv-bench-litellm/bin/litellm
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/ is not installed
from benchmarks.proxy import render_proxy_bench, run_proxy_bench
from orchard.results import publish


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64], help="sessions calling at once")
    parser.add_argument("--calls", type=int, default=50, help="sequential calls per session and path")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "summary.json")
    parser.add_argument("--markdown", type=Path, help="also write its section of this Markdown page")
    parser.add_argument("--litellm", help="the `litellm` command of a venv with litellm[proxy], to measure its "
                        "proxy beside Orchard's (make bench builds .venv-bench-litellm)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.calls < 1 or min(args.concurrency) < 1:
        parser.error("--calls and --concurrency must be at least 1")
    command = shlex.join(["python", "experiments/proxy_bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    summary = run_proxy_bench(tuple(args.concurrency), args.calls, not args.no_progress, command, args.litellm)
    publish(summary, args.out, args.markdown, "proxy_bench", render_proxy_bench)


if __name__ == "__main__":
    main()
