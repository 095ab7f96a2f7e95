"""The main job over several seeds (orchard.recipes.seeds): each seed's run in ``<workdir>/seed_<n>``, then
each held-out rate as mean [min, max] over the seeds and each stage's paired per-task change per seed and
pooled over seeds, with its sign test.

    python experiments/swe_seeds/run.py --config=configs/swe_bar.py:skills --seeds=0,1,2

Takes the main job's config (configs/swe_bar.py) and flags; writes ``seeds.json`` and ``seeds.png`` into the
workdir and ends with the table.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from rich.console import Console

from orchard.recipes.cli import define_recipe_flags, recipe_main
from orchard.recipes.seeds import plot_seeds, run_seeds, seeds_table
from orchard.recipes.swe import SWE

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "swe_bar.py"))
define_recipe_flags(CONFIG, "tiny", "runs/swe_seeds")
flags.DEFINE_list("seeds", ["0", "1", "2"], "the seeds, each a main job in <workdir>/seed_<n>")


def run(config, workdir: str, *, rerun: bool = False) -> dict:
    return run_seeds(SWE, config, workdir, [int(s) for s in flags.FLAGS.seeds], rerun=rerun)


def finish(summary: dict, workdir: str) -> None:
    Console(width=None if sys.stdout.isatty() else 200).print(seeds_table(summary))
    print(f"wrote {os.path.join(workdir, 'seeds.json')} and {plot_seeds(summary, os.path.join(workdir, 'seeds.png'))}")


if __name__ == "__main__":
    app.run(recipe_main(run, SWE.check_config, finish))
