"""Benchmark one long-context training step: blockwise attention and a chunked LM head against the dense path (CPU).

A thin wrapper over :mod:`benchmarks.long_context`; the main venv has all it needs (about 3-5 minutes on 2 cores;
the dense step at 32K tokens is compiled but not run when it would not fit half the available memory):

    python experiments/long_context_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/ is not installed
from benchmarks.long_context import LongContextBenchConfig, render_markdown, run_benchmark
from orchard.results import publish

DEFAULT_OUT = Path(__file__).parent / "results" / "summary.json"


def main(argv: list[str] | None = None) -> None:
    defaults = LongContextBenchConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=list(defaults.tokens), help="row lengths")
    parser.add_argument("--vocab", type=int, default=defaults.vocab)
    parser.add_argument("--segments", type=int, default=defaults.segments, help="packed segments per row")
    parser.add_argument("--attention-block", type=int, default=defaults.attention_block)
    parser.add_argument("--logits-chunk", type=int, default=defaults.logits_chunk)
    parser.add_argument("--remat", choices=("none", "layer"), default=defaults.remat)
    parser.add_argument("--repeats", type=int, default=defaults.repeats, help="timed calls per step, best kept")
    parser.add_argument("--memory-budget-gib", type=float, default=defaults.memory_budget_gib,
                        help="run no step whose compiled peak exceeds this (0: half the available memory)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON summary")
    parser.add_argument("--markdown", type=Path, help="also write its section of this Markdown page")
    args = parser.parse_args(argv)
    cfg = LongContextBenchConfig(tokens=tuple(args.tokens), vocab=args.vocab, segments=args.segments,
                                 attention_block=args.attention_block, logits_chunk=args.logits_chunk,
                                 remat=args.remat, repeats=args.repeats, memory_budget_gib=args.memory_budget_gib)
    command = shlex.join(["python", "experiments/long_context_bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    publish(run_benchmark(cfg, command=command), args.out, args.markdown, "long_context_bench", render_markdown)


if __name__ == "__main__":
    main()
