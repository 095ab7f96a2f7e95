"""The Claw main job: Orchard-Claw end to end (generated tasks, the teacher through the ReAct and the shell
harness, SFT, GRPO with the tests' binary reward, held-out pass^3 / pass@3 in both harnesses) in one command.

    python experiments/claw_grpo/run.py                                      # the embedded default (tiny)
    python experiments/claw_grpo/run.py --config=configs/claw_grpo.py:qwen3_30b_a3b --dry-run

See configs/claw_grpo.py for the variants. The run writes its ``config.json``, ends with a table, and
writes ``held_out.png`` and ``summary.json`` into the workdir.
"""

from __future__ import annotations

import os

from absl import app

from orchard.recipes.claw import CLAW
from orchard.recipes.cli import define_recipe_flags, family_main

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "claw_grpo.py"))
define_recipe_flags(CONFIG, "tiny", "runs/claw_grpo_tiny")

if __name__ == "__main__":
    app.run(family_main(CLAW))
