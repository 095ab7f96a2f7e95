"""Benchmark Claw's tool services in Orchard Env: set-up, a tool call through the port forward against the
same services on the host's loopback and in process, and rollouts per minute at 4, 16 and 64 sandboxes.

A thin wrapper over :mod:`benchmarks.claw` (which documents what is measured). Writes the JSON summary to
``--out`` and, with ``--markdown PATH``, its section of that page. Needs root (sandboxes).

    python experiments/claw_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.claw import render_claw_bench, run_claw_bench
from benchmarks.cli import command, define_integers, define_output_flags, flags_only, integers
from benchmarks.env import BenchConfig
from orchard.results import publish

flags.DEFINE_integer("iterations", 300, "timed rounds of tool calls", lower_bound=2)
flags.DEFINE_integer("warmup", 30, "untimed rounds before those", lower_bound=0)
flags.DEFINE_integer("starts", 10, "fresh set-ups timed", lower_bound=1)
define_integers("concurrency", [4, 16, 64], "sandboxes at once, one rollouts-per-minute run each")
flags.DEFINE_float("seconds", 60.0, "wall time of each rollouts-per-minute run")
flags.register_validator("seconds", lambda s: s > 0, "--seconds must be positive")
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    flags_only(argv)
    cfg = BenchConfig(iterations=FLAGS.iterations, warmup=FLAGS.warmup, progress=False)
    summary = run_claw_bench(cfg, FLAGS.starts, integers("concurrency"), FLAGS.seconds, command(__file__))
    publish(summary, FLAGS.out, FLAGS.markdown, "claw_bench", render_claw_bench)


if __name__ == "__main__":
    app.run(main)
