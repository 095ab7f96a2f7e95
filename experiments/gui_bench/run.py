"""Benchmark Orchard's browser sandbox (both browser modes) against BrowserGym's MiniWoB environment
and the miniwob package's Selenium environment, side by side in one run.

A thin wrapper over :mod:`benchmarks.gui` (which documents what is measured). Writes the JSON
summary to ``--out`` and, with ``--markdown PATH``, its section of that page. ``make bench`` builds
the BrowserGym venv (it pins its own Playwright).

    python experiments/gui_bench/run.py --markdown docs/benchmarks.md \
        --browsergym .venv-bench-browsergym/bin/python --selenium .venv/bin/python
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/ is not installed
from benchmarks.gui import render_gui_bench, run_gui_bench
from orchard.results import publish


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=30, help="samples per latency")
    parser.add_argument("--seconds", type=float, default=20.0, help="wall time of each episodes-per-minute run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--browsergym", help="the Python of a venv with browsergym-miniwob (skipped if absent)")
    parser.add_argument("--selenium", help="the Python of a venv with miniwob and selenium (skipped if absent)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "summary.json")
    parser.add_argument("--markdown", type=Path, help="also write its section of this Markdown page")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.n < 2 or args.seconds <= 0 or min(args.concurrency) < 1:
        parser.error("--n must be at least 2, --seconds positive, --concurrency at least 1")
    command = shlex.join(["python", "experiments/gui_bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    summary = run_gui_bench(args.n, args.seconds, tuple(args.concurrency),
                            {"browsergym": args.browsergym, "selenium": args.selenium}, not args.no_progress, command)
    publish(summary, args.out, args.markdown, "gui_bench", render_gui_bench)


if __name__ == "__main__":
    main()
