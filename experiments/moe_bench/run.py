"""Benchmark the sparse MoE dispatch against the every-expert computation it replaced (CPU).

A thin wrapper over :mod:`benchmarks.moe`; the main venv has all it needs (about 2-3 minutes on 2 cores):

    python experiments/moe_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.cli import command, define_integers, define_output_flags, flags_only, integers
from benchmarks.moe import MoeBenchConfig, render_markdown, run_benchmark
from orchard.results import publish

DEFAULTS = MoeBenchConfig()
flags.DEFINE_integer("hidden_size", DEFAULTS.hidden_size, "the layer's width", lower_bound=1)
flags.DEFINE_integer("ffn", DEFAULTS.ffn, "each expert's intermediate size", lower_bound=1)
define_integers("experts", DEFAULTS.experts, "expert counts")
define_integers("top_k", DEFAULTS.top_k, "experts per token")
flags.DEFINE_integer("tokens", DEFAULTS.tokens, "tokens per pass", lower_bound=1)
flags.DEFINE_integer("repeats", DEFAULTS.repeats, "timed calls per pass, best kept", lower_bound=1)
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    flags_only(argv)
    cfg = MoeBenchConfig(hidden_size=FLAGS.hidden_size, ffn=FLAGS.ffn, experts=integers("experts"),
                         top_k=integers("top_k"), tokens=FLAGS.tokens, repeats=FLAGS.repeats)
    publish(run_benchmark(cfg, command=command(__file__)), FLAGS.out, FLAGS.markdown, "moe_bench", render_markdown)


if __name__ == "__main__":
    app.run(main)
