"""Cross-harness training on Orchard-Claw: SFT arms on the ReAct harness, the shell harness or both, each
evaluated in both and in smolagents' CodeAgent (a harness none was trained on), pass^3 and pass@3.

    python experiments/claw_cross_harness/run.py          # = --config=configs/claw_cross_harness.py:tiny

Writes ``summary.json`` (the matrix) and ``matrix_pass_hat_k.png`` / ``matrix_pass_at_k.png`` into the workdir;
``notebooks/claw_cross_harness.ipynb`` runs the same.
"""

from __future__ import annotations

import json
import os

from absl import app

from orchard.recipes.claw import CLAW
from orchard.recipes.claw_cross_harness import run
from orchard.recipes.cli import define_recipe_flags, recipe_main
from orchard.recipes.report import plot_matrix

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs",
                                       "claw_cross_harness.py"))
define_recipe_flags(CONFIG, "tiny", "runs/claw_cross_harness")


def finish(summary: dict, workdir: str) -> None:
    plots = [plot_matrix(summary, os.path.join(workdir, f"matrix_{m}.png"), m) for m in ("pass_hat_k", "pass_at_k")]
    print(json.dumps({"workdir": workdir, "plots": plots, "matrix": summary["matrix"],
                      "in_to_cross_harness_drop": summary["in_to_cross_harness_drop"]}, indent=2))


if __name__ == "__main__":
    app.run(recipe_main(run, CLAW.check_config, finish))
