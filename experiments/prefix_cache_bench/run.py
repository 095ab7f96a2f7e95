"""Benchmark the sampler's prefix cache against the same sampler without it (SmolLM2-135M, CPU).

A thin wrapper over :mod:`benchmarks.prefix_cache`:

    python experiments/prefix_cache_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.cli import command, define_output_flags, flags_only
from benchmarks.prefix_cache import PrefixBenchConfig, render_markdown, run_benchmark
from orchard.results import publish

DEFAULTS = PrefixBenchConfig()
flags.DEFINE_integer("turns", DEFAULTS.turns, "turns of the episode", lower_bound=1)
flags.DEFINE_integer("turn_tokens", DEFAULTS.turn_tokens, "tokens decoded a turn", lower_bound=1)
flags.DEFINE_integer("group", DEFAULTS.group, "samples of the GRPO group", lower_bound=1)
flags.DEFINE_integer("repeats", DEFAULTS.repeats, "timed runs, best kept", lower_bound=1)
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    flags_only(argv)
    cfg = PrefixBenchConfig(turns=FLAGS.turns, turn_tokens=FLAGS.turn_tokens, group=FLAGS.group,
                            repeats=FLAGS.repeats)
    publish(run_benchmark(cfg, command=command(__file__)), FLAGS.out, FLAGS.markdown, "prefix_cache_bench",
            render_markdown)


if __name__ == "__main__":
    app.run(main)
