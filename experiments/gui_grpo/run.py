"""The GUI main job: Orchard-GUI end to end (MiniWoB++ tasks, oracle trajectories through the real
browser, per-turn SFT of a vision-language policy, multi-turn GRPO, held-out evaluation) in one command.

    python experiments/gui_grpo/run.py                                     # the embedded default (tiny)
    python experiments/gui_grpo/run.py --config=configs/gui_grpo.py:elements --workdir=runs/gui_grpo_elements
    python experiments/gui_grpo/run.py --config=configs/gui_grpo.py:qwen3vl_4b --dry-run

See configs/gui_grpo.py for the variants. The run writes its ``config.json``, ends with a table, and
writes ``success.png`` and ``summary.json`` into the workdir.
"""

from __future__ import annotations

import json
import os

from absl import app
from rich.console import Console

from orchard.recipes.cli import define_recipe_flags, recipe_main
from orchard.recipes.gui import GUIResult, run
from orchard.recipes.gui_report import check_config, headline, plot_curves, summary_table

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "gui_grpo.py"))
define_recipe_flags(CONFIG, "tiny", "runs/gui_grpo_tiny")


def finish(result: GUIResult, workdir: str) -> None:
    plot = plot_curves(result, os.path.join(workdir, "success.png"))
    Console().print(summary_table(result))
    print(json.dumps({"workdir": workdir, "plot": plot, **headline(result)}, indent=2))


if __name__ == "__main__":
    app.run(recipe_main(run, check_config, finish))
