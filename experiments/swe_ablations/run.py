"""The paper's SWE ablations at the main job's scale: credit-assignment SFT, SFT data scale against selection,
and BAR against fixed-N GRPO and dynamic filtering at an equal rollout budget (orchard.recipes.swe_ablations).

    python experiments/swe_ablations/run.py --config.studies=credit    # = --config=configs/swe_ablations.py:tiny
    python experiments/swe_ablations/run.py --config.studies=scale
    python experiments/swe_ablations/run.py --config.studies=rl
    python experiments/swe_ablations/run.py --config.studies=async --markdown docs/benchmarks.md

Writes ``credit.json``, ``scale.json``, ``rl.json`` and ``async.json`` and their plots into the workdir (``runs/swe_ablations``),
which ``notebooks/credit_assignment_sft.ipynb``, ``notebooks/sft_scale_vs_selection.ipynb`` and
``notebooks/bar_vs_fixed_n.ipynb`` load; what they measured is in docs/benchmarks.md.
"""

from __future__ import annotations

import os

from absl import app, flags

from benchmarks.cli import command
from orchard.recipes.ablation_report import (
    async_markdown,
    async_table,
    check_config,
    credit_table,
    init_table,
    plot_arms,
    plot_async,
    plot_rl,
    plot_scale,
    rl_table,
    scale_table,
)
from orchard.recipes.cli import define_recipe_flags, recipe_main
from orchard.recipes.swe_ablations import run
from orchard.results import write_markdown_section

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs",
                                       "swe_ablations.py"))
define_recipe_flags(CONFIG, "tiny", "runs/swe_ablations")
flags.DEFINE_string("markdown", "", "also write the async study's section of this page (docs/benchmarks.md)")


def finish(summaries: dict, workdir: str) -> None:
    if "credit" in summaries:
        print(credit_table(summaries["credit"]))
        print(plot_arms(summaries["credit"], os.path.join(workdir, "credit.png")))
    if "scale" in summaries:
        for measure in summaries["scale"]["passes"]:
            print(scale_table(summaries["scale"], measure))
        print(plot_scale(summaries["scale"], os.path.join(workdir, "scale.png")))
    if "rl" in summaries:
        print(rl_table(summaries["rl"]))
        print(init_table(summaries["rl"]))
        print(plot_rl(summaries["rl"], os.path.join(workdir, "rl.png")))
    if "async" in summaries:
        print(async_table(summaries["async"]))
        print(plot_async(summaries["async"], os.path.join(workdir, "async.png")))
        if flags.FLAGS.markdown:
            write_markdown_section(flags.FLAGS.markdown, "async_rl", async_markdown(summaries["async"], command(__file__)))


if __name__ == "__main__":
    app.run(recipe_main(run, check_config, finish))
