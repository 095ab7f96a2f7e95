"""Benchmark the JAX sampler against HF transformers ``generate`` (SmolLM2-135M, CPU).

A thin wrapper over :mod:`benchmarks.sampler`. Needs the bench extra (torch, transformers):

    pip install -e .[bench]
    python experiments/sampler_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/ is not installed
from benchmarks.sampler import SamplerBenchConfig, render_markdown, run_benchmark
from orchard.results import publish

DEFAULT_OUT = Path(__file__).parent / "results" / "summary.json"


def main(argv: list[str] | None = None) -> None:
    defaults = SamplerBenchConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=defaults.new_tokens)
    parser.add_argument("--batches", type=int, nargs="+", default=list(defaults.batches))
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON summary")
    parser.add_argument("--markdown", type=Path, help="also write its section of this Markdown page")
    args = parser.parse_args(argv)
    cfg = SamplerBenchConfig(new_tokens=args.new_tokens, batches=tuple(args.batches), repeats=args.repeats)
    command = shlex.join(["python", "experiments/sampler_bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    publish(run_benchmark(cfg, command=command), args.out, args.markdown, "sampler_bench", render_markdown)


if __name__ == "__main__":
    main()
