"""The Claw main job: Orchard-Claw end to end (generated tasks, the teacher through the ReAct and the shell
harness, SFT, GRPO with the tests' binary reward, held-out pass^3 / pass@3 in both harnesses) in one command.

    python experiments/claw_grpo/run.py                                      # the embedded default (tiny)
    python experiments/claw_grpo/run.py --config=configs/claw_grpo.py:qwen3_30b_a3b --dry-run

See configs/claw_grpo.py for the variants. The run writes its ``config.json``, ends with a table, and
writes ``claw.png`` and ``summary.json`` into the workdir.
"""

from __future__ import annotations

import json
import os

from absl import app
from rich.console import Console

from orchard.recipes.claw import ClawResult, run
from orchard.recipes.claw_report import check_config, headline, plot_curves, summary_table
from orchard.recipes.cli import define_recipe_flags, recipe_main

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "claw_grpo.py"))
define_recipe_flags(CONFIG, "tiny", "runs/claw_grpo_tiny")


def finish(result: ClawResult, workdir: str) -> None:
    plot = plot_curves(result, os.path.join(workdir, "claw.png"))
    Console().print(summary_table(result))
    print(json.dumps({"workdir": workdir, "plot": plot, **headline(result)}, indent=2))


if __name__ == "__main__":
    app.run(recipe_main(run, check_config, finish))
