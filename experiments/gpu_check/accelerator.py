"""The learner and the sampler on one accelerator, against PyTorch on the same device (no vLLM needed).

    python experiments/gpu_check/accelerator.py --out /tmp/accelerator            # Qwen3-0.6B shapes, < 8 min
    python experiments/gpu_check/accelerator.py --size tiny --out /tmp/accel      # what the CPU test runs

Each section of :mod:`benchmarks.accelerator` runs in a process of its own (JAX preallocates most of a GPU's
memory; torch must not share it), under its share of ``--budget_s``: a section that crashes or runs out of time
is recorded with its error or ``timeout`` and the others still run. ``torch_sampler`` reads the weights and
greedy tokens ``orchard_sampler`` wrote. Everything goes to ``OUT/summary.json``: each section's result, its
status and seconds, and the headline ratios (Orchard over torch); ``--markdown`` also writes its section of
``docs/benchmarks.md``. Needs the project's ``train`` extra, and torch with transformers for the peer's sections.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict

from absl import app, flags

from benchmarks.accelerator import SECTIONS, SIZES, compare
from benchmarks.cli import command, flags_only
from orchard.results import write_markdown_section

flags.DEFINE_string("out", "experiments/gpu_check/results/accelerator", "where summary.json and the weights go")
flags.DEFINE_enum("size", "qwen3_0_6b", list(SIZES), "the shapes: the device check's, or the CPU test's")
flags.DEFINE_list("sections", list(SECTIONS), "the sections to run, in order")
flags.DEFINE_integer("budget_s", 480, "the whole check's time box, in seconds", lower_bound=1)
flags.DEFINE_string("section", "", "(internal) run this one section in this process")
flags.DEFINE_string("markdown", "", "also write the check's section of this page (docs/benchmarks.md)")
FLAGS = flags.FLAGS


def run_section(name: str, size: str, out: str, seconds: float) -> dict:
    """One section in a fresh process under ``seconds``; its result, or its error or timeout."""
    started = time.perf_counter()
    result_path = os.path.join(out, f"{name}.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    try:
        process = subprocess.run([sys.executable, os.path.abspath(__file__), f"--section={name}", f"--size={size}",
                                  f"--out={out}"], capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": time.perf_counter() - started}
    elapsed = time.perf_counter() - started
    if process.returncode != 0 or not os.path.exists(result_path):
        return {"status": "error", "seconds": elapsed, "error": process.stderr[-2000:]}
    with open(result_path) as handle:
        return {"status": "ok", "seconds": elapsed, "result": json.load(handle)}


def markdown(summary: dict) -> str:
    lines = [f"The accelerator check at `{summary['size']}` shapes (`{summary['command']}`), each section's status "
             "and the headline ratios (Orchard over PyTorch on the same device; attention: time over the peer's).",
             "", "| section | status | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {entry['status']} | {entry['seconds']:.1f} |" for name, entry in summary["sections"].items()]
    lines += ["", "| ratio | value |", "|---|---|"]
    lines += [f"| {name} | {value:.2f} |" for name, value in summary["ratios"].items()]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    flags_only(argv)
    size = SIZES[FLAGS.size]
    os.makedirs(FLAGS.out, exist_ok=True)
    if FLAGS.section:  # a child: one section, its result to OUT/<section>.json
        result = SECTIONS[FLAGS.section](size, FLAGS.out)
        with open(os.path.join(FLAGS.out, f"{FLAGS.section}.json"), "w") as handle:
            json.dump(result, handle, indent=2)
        return
    unknown = sorted(set(FLAGS.sections) - set(SECTIONS))
    if unknown:
        sys.exit(f"unknown sections {unknown}: of {sorted(SECTIONS)}")
    deadline = time.monotonic() + FLAGS.budget_s
    sections = {}
    for index, name in enumerate(FLAGS.sections):
        share = (deadline - time.monotonic()) / (len(FLAGS.sections) - index)
        sections[name] = run_section(name, FLAGS.size, FLAGS.out, max(share, 1.0))
        print(f"{name}: {sections[name]['status']} in {sections[name]['seconds']:.1f} s", flush=True)
    results = {name: entry["result"] for name, entry in sections.items() if entry["status"] == "ok"}
    summary = {"size": FLAGS.size, "shapes": asdict(size), "command": command(__file__), "sections": sections,
               "ratios": compare(results)}
    with open(os.path.join(FLAGS.out, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=2)
    print(json.dumps(summary["ratios"], indent=2))
    if FLAGS.markdown:
        write_markdown_section(FLAGS.markdown, "accelerator_check", markdown(summary))


if __name__ == "__main__":
    app.run(main)
