"""Training tokens/s of a from-scratch SWE policy at each size (benchmarks.policy_size).

    python experiments/policy_size/run.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.cli import command, define_output_flags, flags_only
from benchmarks.policy_size import SftBenchConfig, render_markdown, run_sweep
from orchard.results import publish

flags.DEFINE_integer("seq_len", 1024, "tokens per row (the SWE recipe's sft.seq_len)", lower_bound=16)
flags.DEFINE_integer("batch_size", 4, "rows per step (the SWE recipe's sft.batch_size)", lower_bound=1)
flags.DEFINE_integer("vocab_size", 2048, "the trained BPE's vocabulary", lower_bound=260)
flags.DEFINE_integer("steps", 5, "timed steps per round", lower_bound=1)
flags.DEFINE_integer("repeats", 3, "timed rounds per shape", lower_bound=1)
define_output_flags(__file__)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    flags_only(argv)
    base = SftBenchConfig(vocab_size=FLAGS.vocab_size, seq_len=FLAGS.seq_len, batch_size=FLAGS.batch_size, warmup=1,
                          steps=FLAGS.steps, repeats=FLAGS.repeats)
    publish(run_sweep(base, command=command(__file__)), FLAGS.out, FLAGS.markdown, "policy_size", render_markdown)


if __name__ == "__main__":
    app.run(main)
