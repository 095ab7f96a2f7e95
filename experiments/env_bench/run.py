"""Benchmark Orchard Env exec and create latency against SWE-ReX and a host subprocess.

A thin wrapper over :mod:`benchmarks.env` (which documents what is measured). Prints the JSON
summary to stdout, writes it to ``--out``, and with ``--markdown PATH`` renders it as a Markdown page.
Needs root: orchard sandboxes use Linux namespaces.

    python experiments/env_bench/run.py --markdown docs/benchmarks.md
    python experiments/env_bench/run.py --stress 1000 --markdown docs/benchmarks.md
    python experiments/env_bench/run.py --soak 10 --markdown docs/benchmarks.md

``--confinement`` times sandboxes with and without the seccomp filter side by side
(:mod:`benchmarks.confinement`, ``results/confinement.json``); ``--ports`` times a request and a WebSocket
round trip through a port forward against exec (:mod:`benchmarks.ports`, ``results/ports.json``). ``--stress N``
and ``--soak MINUTES`` run the scale checks of :mod:`benchmarks.env_scale` instead of the latency comparison,
and write ``results/stress.json`` or ``results/soak.json``.
"""

from __future__ import annotations

import asyncio
import os
import platform
from pathlib import Path

from absl import app, flags

from benchmarks.cli import command, define_output_flags, flags_only
from benchmarks.confinement import render_confinement, run_confinement
from benchmarks.env import BenchConfig, render_markdown, run_benchmark
from benchmarks.env_scale import fork_and_claim, render_soak, render_stress, soak, stress
from benchmarks.ports import render_ports, run_ports
from orchard.env import local_server
from orchard.results import publish

DEFAULTS = BenchConfig()
flags.DEFINE_integer("iterations", DEFAULTS.iterations, "timed exec calls per backend", lower_bound=1)
flags.DEFINE_integer("warmup", DEFAULTS.warmup, "untimed exec calls before those", lower_bound=0)
flags.DEFINE_integer("concurrency", DEFAULTS.concurrency, "orchard sandboxes busy at once", lower_bound=1)
flags.DEFINE_integer("per_sandbox", DEFAULTS.per_sandbox, "exec calls each busy sandbox makes", lower_bound=1)
flags.DEFINE_integer("rounds", DEFAULTS.rounds, "rounds of alternating order for the side-by-side measurements",
                     lower_bound=1)
flags.DEFINE_integer("creates", DEFAULTS.creates, "sandboxes created one at a time for create latency",
                     lower_bound=1)
flags.DEFINE_bool("progress", True, "show progress bars (--noprogress hides them)")
flags.DEFINE_integer("stress", None, "N concurrent sandboxes, 4 commands each, then fork and warm-pool latency")
flags.DEFINE_float("soak", None, "minutes of create/exec/delete churn; report leaks")
flags.DEFINE_bool("confinement", False,
                  "create-to-first-exec and exec with and without the seccomp filter, side by side")
flags.DEFINE_bool("ports", False, "an HTTP request and a WebSocket round trip through a port forward, against exec")
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    """Run the benchmark and write its outputs."""
    flags_only(argv)
    out, run = Path(FLAGS.out), command(__file__)
    if FLAGS.stress or FLAGS.soak:
        run_scale(out, run)
        return
    cfg = BenchConfig(iterations=FLAGS.iterations, warmup=FLAGS.warmup, concurrency=FLAGS.concurrency,
                      per_sandbox=FLAGS.per_sandbox, creates=FLAGS.creates, rounds=FLAGS.rounds,
                      progress=FLAGS.progress)
    if FLAGS.confinement:
        publish(run_confinement(cfg, command=run), out.with_name("confinement.json"), FLAGS.markdown,
                "env_confinement", render_confinement)
        return
    if FLAGS.ports:
        publish(run_ports(cfg, command=run), out.with_name("ports.json"), FLAGS.markdown, "env_ports", render_ports)
        return
    publish(run_benchmark(cfg, command=run), out, FLAGS.markdown, "env_bench", render_markdown)


def run_scale(out: Path, run: str) -> None:
    """``--stress`` and ``--soak``: each against a fresh orchestrator."""
    base = {"command": run, "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    if FLAGS.stress:
        with local_server() as server:
            summary = {**base, "stress": asyncio.run(stress(server, FLAGS.stress, progress=FLAGS.progress))}
            summary["fork_and_claim"] = asyncio.run(fork_and_claim(server))
        publish(summary, out.with_name("stress.json"), FLAGS.markdown, "env_stress", render_stress)
    if FLAGS.soak:
        with local_server() as server:
            summary = {**base, "soak": asyncio.run(soak(server, FLAGS.soak, progress=FLAGS.progress))}
        publish(summary, out.with_name("soak.json"), FLAGS.markdown, "env_soak", render_soak)


if __name__ == "__main__":
    app.run(main)
