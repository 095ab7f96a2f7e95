"""Benchmark one long-context training step: blockwise attention and a chunked LM head against the dense path (CPU).

A thin wrapper over :mod:`benchmarks.long_context`; the main venv has all it needs (about 3-5 minutes on 2 cores;
the dense step at 32K tokens is compiled but not run when it would not fit half the available memory):

    python experiments/long_context_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.cli import command, define_integers, define_output_flags, flags_only, integers
from benchmarks.long_context import LongContextBenchConfig, render_markdown, run_benchmark
from orchard.results import publish

DEFAULTS = LongContextBenchConfig()
define_integers("tokens", DEFAULTS.tokens, "row lengths")
flags.DEFINE_integer("vocab", DEFAULTS.vocab, "vocabulary size", lower_bound=1)
flags.DEFINE_integer("segments", DEFAULTS.segments, "packed segments per row", lower_bound=1)
flags.DEFINE_integer("attention_block", DEFAULTS.attention_block, "flash attention's block", lower_bound=1)
flags.DEFINE_integer("logits_chunk", DEFAULTS.logits_chunk, "positions the LM head projects at a time", lower_bound=1)
flags.DEFINE_enum("remat", DEFAULTS.remat, ["none", "layer"], "rematerialisation")
flags.DEFINE_integer("repeats", DEFAULTS.repeats, "timed calls per step, best kept", lower_bound=1)
flags.DEFINE_float("memory_budget_gib", DEFAULTS.memory_budget_gib,
                   "run no step whose compiled peak exceeds this (0: half the available memory)", lower_bound=0)
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    flags_only(argv)
    cfg = LongContextBenchConfig(tokens=integers("tokens"), vocab=FLAGS.vocab, segments=FLAGS.segments,
                                 attention_block=FLAGS.attention_block, logits_chunk=FLAGS.logits_chunk,
                                 remat=FLAGS.remat, repeats=FLAGS.repeats, memory_budget_gib=FLAGS.memory_budget_gib)
    publish(run_benchmark(cfg, command=command(__file__)), FLAGS.out, FLAGS.markdown, "long_context_bench",
            render_markdown)


if __name__ == "__main__":
    app.run(main)
