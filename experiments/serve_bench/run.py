"""Benchmark `orchard serve` with continuous batching against one request at a time, same model, same run.

A thin wrapper over :mod:`benchmarks.serving` (which documents what is measured). Writes the JSON
summary to ``--out`` and, with ``--markdown PATH``, its section of that page.

    python experiments/serve_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.cli import command, define_integers, define_output_flags, flags_only, integers
from benchmarks.serving import render_serving_bench, run_serving_bench
from orchard.results import publish

define_integers("concurrency", [1, 8, 32], "sessions calling at once")
flags.DEFINE_integer("requests", 2, "sequential requests per session", lower_bound=1)
flags.DEFINE_integer("max_tokens", 32, "tokens per completion", lower_bound=1)
flags.DEFINE_integer("prompt_tokens", 64, "tokens per prompt", lower_bound=1)
flags.DEFINE_bool("progress", True, "show progress bars (--noprogress hides them)")
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    flags_only(argv)
    summary = run_serving_bench(integers("concurrency"), FLAGS.requests, FLAGS.max_tokens, FLAGS.prompt_tokens,
                                FLAGS.progress, command(__file__))
    publish(summary, FLAGS.out, FLAGS.markdown, "serve_bench", render_serving_bench)


if __name__ == "__main__":
    app.run(main)
