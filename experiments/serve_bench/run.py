"""Benchmark `orchard serve` with continuous batching against one request at a time, same model, same run.

A thin wrapper over :mod:`benchmarks.serving` (which documents what is measured). Writes the JSON
summary to ``--out`` and, with ``--markdown PATH``, its section of that page.

    python experiments/serve_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/ is not installed
from benchmarks.serving import render_serving_bench, run_serving_bench
from orchard.results import publish


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="sessions calling at once")
    parser.add_argument("--requests", type=int, default=2, help="sequential requests per session")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "summary.json")
    parser.add_argument("--markdown", type=Path, help="also write its section of this Markdown page")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if min(args.requests, args.max_tokens, args.prompt_tokens, *args.concurrency) < 1:
        parser.error("--concurrency, --requests, --max-tokens and --prompt-tokens must be at least 1")
    command = shlex.join(["python", "experiments/serve_bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    summary = run_serving_bench(tuple(args.concurrency), args.requests, args.max_tokens, args.prompt_tokens,
                                not args.no_progress, command)
    publish(summary, args.out, args.markdown, "serve_bench", render_serving_bench)


if __name__ == "__main__":
    main()
