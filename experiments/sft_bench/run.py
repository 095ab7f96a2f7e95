"""Benchmark Orchard's SFT train step against google-tunix's ``PeftTrainer`` (tiny model, CPU).

A thin wrapper over :mod:`benchmarks.sft`. Needs google-tunix, which wants other transformers
and tokenizers versions than the main venv, so use a venv of its own:

    python3 -m venv .venv-bench-tunix
    .venv-bench-tunix/bin/pip install -e '.[train,env]' google-tunix
    .venv-bench-tunix/bin/python experiments/sft_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/ is not installed
from benchmarks.sft import SftBenchConfig, render_markdown, run_benchmark
from orchard.results import publish

DEFAULT_OUT = Path(__file__).parent / "results" / "summary.json"


def main(argv: list[str] | None = None) -> None:
    defaults = SftBenchConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--warmup", type=int, default=defaults.warmup, help="untimed steps per side")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="timed steps per side and round")
    parser.add_argument("--repeats", type=int, default=defaults.repeats, help="timed rounds per side")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON summary")
    parser.add_argument("--markdown", type=Path, help="also write its section of this Markdown page")
    args = parser.parse_args(argv)
    cfg = SftBenchConfig(seq_len=args.seq_len, batch_size=args.batch_size, warmup=args.warmup, steps=args.steps,
                         repeats=args.repeats)
    command = shlex.join(["python", "experiments/sft_bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    publish(run_benchmark(cfg, command=command), args.out, args.markdown, "sft_bench", render_markdown)


if __name__ == "__main__":
    main()
