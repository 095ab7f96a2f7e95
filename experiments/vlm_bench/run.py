"""Benchmark Orchard's Qwen3-VL against transformers' on the same weights: images per second through the
vision tower and prefill tokens per second with an image (CPU, fp32).

A thin wrapper over :mod:`benchmarks.vlm`. Needs the bench extra (torch, transformers):

    pip install -e .[bench]
    python experiments/vlm_bench/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/ is not installed
from benchmarks.vlm import VLMBenchConfig, render_markdown, run_benchmark
from orchard.results import publish


def main(argv: list[str] | None = None) -> None:
    defaults = VLMBenchConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=defaults.images)
    parser.add_argument("--prompt-tokens", type=int, default=defaults.prompt_tokens)
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "summary.json")
    parser.add_argument("--markdown", type=Path, help="also write its section of this Markdown page")
    args = parser.parse_args(argv)
    cfg = VLMBenchConfig(images=args.images, prompt_tokens=args.prompt_tokens, repeats=args.repeats)
    command = shlex.join(["python", "experiments/vlm_bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    publish(run_benchmark(cfg, command=command), args.out, args.markdown, "vlm_bench", render_markdown)


if __name__ == "__main__":
    main()
