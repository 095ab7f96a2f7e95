"""Benchmark Orchard's SFT train step against google-tunix's ``PeftTrainer`` (tiny model, CPU).

A thin wrapper over :mod:`benchmarks.sft`. Needs google-tunix, which wants other transformers
and tokenizers versions than the main venv, so use a venv of its own:

    python3 -m venv .venv-bench-tunix
    .venv-bench-tunix/bin/pip install -e '.[train,env]' google-tunix
    .venv-bench-tunix/bin/python experiments/sft_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.cli import command, define_output_flags, flags_only
from benchmarks.sft import SftBenchConfig, render_markdown, run_benchmark
from orchard.results import publish

DEFAULTS = SftBenchConfig()
flags.DEFINE_integer("seq_len", DEFAULTS.seq_len, "tokens per packed row", lower_bound=1)
flags.DEFINE_integer("batch_size", DEFAULTS.batch_size, "rows per batch", lower_bound=1)
flags.DEFINE_integer("warmup", DEFAULTS.warmup, "untimed steps per side", lower_bound=0)
flags.DEFINE_integer("steps", DEFAULTS.steps, "timed steps per side and round", lower_bound=1)
flags.DEFINE_integer("repeats", DEFAULTS.repeats, "timed rounds per side", lower_bound=1)
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    flags_only(argv)
    cfg = SftBenchConfig(seq_len=FLAGS.seq_len, batch_size=FLAGS.batch_size, warmup=FLAGS.warmup, steps=FLAGS.steps,
                         repeats=FLAGS.repeats)
    publish(run_benchmark(cfg, command=command(__file__)), FLAGS.out, FLAGS.markdown, "sft_bench", render_markdown)


if __name__ == "__main__":
    app.run(main)
