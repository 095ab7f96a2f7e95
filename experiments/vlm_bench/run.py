"""Benchmark Orchard's Qwen3-VL against transformers' on the same weights: images per second through the
vision tower and prefill tokens per second with an image (CPU, fp32).

A thin wrapper over :mod:`benchmarks.vlm`. Needs the bench extra (torch, transformers):

    pip install -e .[bench]
    python experiments/vlm_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.cli import command, define_output_flags, flags_only
from benchmarks.vlm import VLMBenchConfig, render_markdown, run_benchmark
from orchard.results import publish

DEFAULTS = VLMBenchConfig()
flags.DEFINE_integer("images", DEFAULTS.images, "screenshots through the vision tower", lower_bound=1)
flags.DEFINE_integer("prompt_tokens", DEFAULTS.prompt_tokens, "prefill tokens with one image", lower_bound=1)
flags.DEFINE_integer("repeats", DEFAULTS.repeats, "timed repeats, best kept", lower_bound=1)
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    flags_only(argv)
    cfg = VLMBenchConfig(images=FLAGS.images, prompt_tokens=FLAGS.prompt_tokens, repeats=FLAGS.repeats)
    publish(run_benchmark(cfg, command=command(__file__)), FLAGS.out, FLAGS.markdown, "vlm_bench", render_markdown)


if __name__ == "__main__":
    app.run(main)
