"""The main job: Orchard-SWE end to end (tasks, teacher trajectories, credit-assignment SFT, BAR RL,
held-out evaluation) in one command.

    python experiments/swe_bar/run.py                                   # the embedded default (tiny)
    python experiments/swe_bar/run.py --config=configs/swe_bar.py:qwen3_30b_a3b --dry-run

See configs/swe_bar.py for the variants. The run writes its ``config.json``, ends with a table, and
writes ``resolve_rate.png`` and ``summary.json`` into the workdir.
"""

from __future__ import annotations

import json
import os

from absl import app
from rich.console import Console

from orchard.recipes.cli import define_recipe_flags, recipe_main
from orchard.recipes.report import check_config, plot_curves, summary_table
from orchard.recipes.swe import RecipeResult, run

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "swe_bar.py"))
define_recipe_flags(CONFIG, "tiny", "runs/swe_bar_tiny")


def finish(result: RecipeResult, workdir: str) -> None:
    plot = plot_curves(result, os.path.join(workdir, "resolve_rate.png"))
    Console().print(summary_table(result))
    print(json.dumps({"workdir": workdir, "plot": plot, "held_out": result.held_out, "rl_change": result.rl_change},
                     indent=2))


if __name__ == "__main__":
    app.run(recipe_main(run, check_config, finish))
