"""Benchmark the JAX sampler against HF transformers ``generate`` (SmolLM2-135M, CPU).

A thin wrapper over :mod:`benchmarks.sampler`. Needs the bench extra (torch, transformers):

    pip install -e .[bench]
    python experiments/sampler_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.cli import command, define_integers, define_output_flags, flags_only, integers
from benchmarks.sampler import SamplerBenchConfig, render_markdown, run_benchmark
from orchard.results import publish

DEFAULTS = SamplerBenchConfig()
flags.DEFINE_integer("new_tokens", DEFAULTS.new_tokens, "tokens decoded per request", lower_bound=1)
define_integers("batches", DEFAULTS.batches, "batch sizes")
flags.DEFINE_integer("repeats", DEFAULTS.repeats, "timed repeats, best kept", lower_bound=1)
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    flags_only(argv)
    cfg = SamplerBenchConfig(new_tokens=FLAGS.new_tokens, batches=integers("batches"), repeats=FLAGS.repeats)
    publish(run_benchmark(cfg, command=command(__file__)), FLAGS.out, FLAGS.markdown, "sampler_bench",
            render_markdown)


if __name__ == "__main__":
    app.run(main)
