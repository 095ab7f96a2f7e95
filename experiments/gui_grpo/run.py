"""The GUI main job: Orchard-GUI end to end (MiniWoB++ tasks, oracle trajectories through the real
browser, per-turn SFT of a vision-language policy, multi-turn GRPO, held-out evaluation) in one command.

    python experiments/gui_grpo/run.py                                     # the embedded default (tiny)
    python experiments/gui_grpo/run.py --config=configs/gui_grpo.py:elements --workdir=runs/gui_grpo_elements
    python experiments/gui_grpo/run.py --config=configs/gui_grpo.py:qwen3vl_4b --dry-run

See configs/gui_grpo.py for the variants. The run writes its ``config.json``, ends with a table, and
writes ``held_out.png`` and ``summary.json`` into the workdir.
"""

from __future__ import annotations

import os

from absl import app

from orchard.recipes.cli import define_recipe_flags, family_main
from orchard.recipes.gui import GUI

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "gui_grpo.py"))
define_recipe_flags(CONFIG, "tiny", "runs/gui_grpo_tiny")

if __name__ == "__main__":
    app.run(family_main(GUI))
