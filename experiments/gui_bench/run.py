"""Benchmark Orchard's browser sandbox (both browser modes) against BrowserGym's MiniWoB environment
and the miniwob package's Selenium environment, side by side in one run.

A thin wrapper over :mod:`benchmarks.gui` (which documents what is measured). Writes the JSON
summary to ``--out`` and, with ``--markdown PATH``, its section of that page. ``make bench`` builds
the BrowserGym venv (it pins its own Playwright).

    python experiments/gui_bench/run.py --markdown docs/benchmarks.md \
        --browsergym .venv-bench-browsergym/bin/python --selenium .venv/bin/python
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.cli import command, define_integers, define_output_flags, flags_only, integers
from benchmarks.gui import render_gui_bench, run_gui_bench
from orchard.results import publish

flags.DEFINE_integer("n", 30, "samples per latency", lower_bound=2)
flags.DEFINE_float("seconds", 20.0, "wall time of each episodes-per-minute run")
flags.register_validator("seconds", lambda s: s > 0, "--seconds must be positive")
define_integers("concurrency", [1, 2, 4], "browsers at once, one episodes-per-minute run each")
flags.DEFINE_string("browsergym", None, "the Python of a venv with browsergym-miniwob (skipped if absent)")
flags.DEFINE_string("selenium", None, "the Python of a venv with miniwob and selenium (skipped if absent)")
flags.DEFINE_bool("progress", True, "show progress bars (--noprogress hides them)")
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    flags_only(argv)
    summary = run_gui_bench(FLAGS.n, FLAGS.seconds, integers("concurrency"),
                            {"browsergym": FLAGS.browsergym, "selenium": FLAGS.selenium}, FLAGS.progress,
                            command(__file__))
    publish(summary, FLAGS.out, FLAGS.markdown, "gui_bench", render_gui_bench)


if __name__ == "__main__":
    app.run(main)
