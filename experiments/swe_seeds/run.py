"""The main job over several seeds (orchard.recipes.seeds): each seed's run in ``<workdir>/seed_<n>``, then
each held-out rate as mean [min, max] over the seeds and each stage's paired per-task change per seed and
pooled over seeds, with its sign test.

    python experiments/swe_seeds/run.py --config=configs/swe_bar.py:skills --seeds=0,1,2

Takes the main job's config (configs/swe_bar.py) and flags; writes ``seeds.json`` and ``seeds.png`` into the
workdir and ends with the table; ``--markdown README.md`` also writes it as that page's ``swe_seeds`` section.
``--report_only`` summarises the seeds already run in the workdir (their ``summary.json`` and evaluation
folders) and runs nothing, whatever code or config made them.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from rich.console import Console

from benchmarks.cli import command
from orchard.recipes.cli import define_recipe_flags, recipe_main
from orchard.recipes.seeds import plot_seeds, run_seeds, seeds_markdown, seeds_table, summarise_seeds
from orchard.recipes.swe import SWE
from orchard.results import write_markdown_section

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "swe_bar.py"))
define_recipe_flags(CONFIG, "tiny", "runs/swe_seeds")
flags.DEFINE_list("seeds", ["0", "1", "2"], "the seeds, each a main job in <workdir>/seed_<n>")
flags.DEFINE_bool("report_only", False, "summarise the seeds already run in the workdir; run nothing")
flags.DEFINE_string("markdown", None, "also write the table as this Markdown page's swe_seeds section")


def run(config, workdir: str, *, rerun: bool = False) -> dict:
    seeds = [int(s) for s in flags.FLAGS.seeds]
    if flags.FLAGS.report_only:
        return summarise_seeds(SWE, workdir, seeds)
    return run_seeds(SWE, config, workdir, seeds, rerun=rerun)


def finish(summary: dict, workdir: str) -> None:
    Console(width=None if sys.stdout.isatty() else 200).print(seeds_table(summary))
    print(f"wrote {os.path.join(workdir, 'seeds.json')} and {plot_seeds(summary, os.path.join(workdir, 'seeds.png'))}")
    if flags.FLAGS.markdown:
        write_markdown_section(flags.FLAGS.markdown, "swe_seeds", seeds_markdown(summary, command(__file__)))
        print(f"wrote the swe_seeds section of {flags.FLAGS.markdown}")


if __name__ == "__main__":
    app.run(recipe_main(run, SWE.check_config, finish))
