"""Benchmark the sparse MoE dispatch against the every-expert computation it replaced (CPU).

A thin wrapper over :mod:`benchmarks.moe`; the main venv has all it needs (about 2-3 minutes on 2 cores):

    python experiments/moe_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/ is not installed
from benchmarks.moe import MoeBenchConfig, render_markdown, run_benchmark
from orchard.results import publish

DEFAULT_OUT = Path(__file__).parent / "results" / "summary.json"


def main(argv: list[str] | None = None) -> None:
    defaults = MoeBenchConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    parser.add_argument("--ffn", type=int, default=defaults.ffn, help="each expert's intermediate size")
    parser.add_argument("--experts", type=int, nargs="+", default=list(defaults.experts))
    parser.add_argument("--top-k", type=int, nargs="+", default=list(defaults.top_k))
    parser.add_argument("--tokens", type=int, default=defaults.tokens)
    parser.add_argument("--repeats", type=int, default=defaults.repeats, help="timed calls per pass, best kept")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON summary")
    parser.add_argument("--markdown", type=Path, help="also write its section of this Markdown page")
    args = parser.parse_args(argv)
    cfg = MoeBenchConfig(hidden_size=args.hidden_size, ffn=args.ffn, experts=tuple(args.experts),
                         top_k=tuple(args.top_k), tokens=args.tokens, repeats=args.repeats)
    command = shlex.join(["python", "experiments/moe_bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    publish(run_benchmark(cfg, command=command), args.out, args.markdown, "moe_bench", render_markdown)


if __name__ == "__main__":
    main()
