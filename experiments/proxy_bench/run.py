"""Benchmark the recording proxy's added latency against calling the upstream directly and LiteLLM's proxy.

A thin wrapper over :mod:`benchmarks.proxy` (which documents what is measured). Writes the JSON
summary to ``--out`` and, with ``--markdown PATH``, its section of that page.

    python experiments/proxy_bench/run.py --markdown docs/benchmarks.md --litellm .venv-bench-litellm/bin/litellm
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.cli import command, define_integers, define_output_flags, flags_only, integers
from benchmarks.proxy import render_proxy_bench, run_proxy_bench
from orchard.results import publish

define_integers("concurrency", [1, 16, 64], "sessions calling at once")
flags.DEFINE_integer("calls", 50, "sequential calls per session and path", lower_bound=1)
flags.DEFINE_string("litellm", None, "the `litellm` command of a venv with litellm[proxy], to measure its proxy "
                    "beside Orchard's (make bench builds .venv-bench-litellm)")
flags.DEFINE_bool("progress", True, "show progress bars (--noprogress hides them)")
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    flags_only(argv)
    summary = run_proxy_bench(integers("concurrency"), FLAGS.calls, FLAGS.progress, command(__file__), FLAGS.litellm)
    publish(summary, FLAGS.out, FLAGS.markdown, "proxy_bench", render_proxy_bench)


if __name__ == "__main__":
    app.run(main)
