"""The main job: Orchard-SWE end to end (tasks, teacher trajectories, credit-assignment SFT, BAR RL,
held-out evaluation) in one command.

    python experiments/swe_bar/run.py                                   # the embedded default (tiny)
    python experiments/swe_bar/run.py --config=configs/swe_bar.py:qwen3_30b_a3b --dry-run

See configs/swe_bar.py for the variants. The run writes its ``config.json``, ends with a table, and
writes ``held_out.png`` and ``summary.json`` into the workdir.
"""

from __future__ import annotations

import os

from absl import app

from orchard.recipes.cli import define_recipe_flags, family_main
from orchard.recipes.swe import SWE

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "swe_bar.py"))
define_recipe_flags(CONFIG, "tiny", "runs/swe_bar_tiny")

if __name__ == "__main__":
    app.run(family_main(SWE))
