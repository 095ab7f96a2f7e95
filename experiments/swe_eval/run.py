"""Evaluate a policy directory on an SWE-bench-format instance file, greedy and sampled, with the main job's
metrics, folders and table (orchard.recipes.swe_eval).

    python experiments/swe_eval/run.py --config.policy=runs/swe_bar_tiny/rl/model \
        --config.tasks.path=runs/swe_bar_tiny/tasks/instances.jsonl --workdir=runs/swe_eval

Writes ``summary.json`` (the main job's schema) and ``eval/<set>/bash/policy_<pass>/`` (result.json and the
episodes) into the workdir.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app
from rich.console import Console

from orchard.recipes.cli import define_recipe_flags, recipe_main
from orchard.recipes.report import headline, summary_table
from orchard.recipes.runner import RecipeResult
from orchard.recipes.swe import SWE
from orchard.recipes.swe_eval import check, run_eval

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "swe_eval.py"))
define_recipe_flags(CONFIG, "tiny", "runs/swe_eval")


def finish(result: RecipeResult, workdir: str) -> None:
    Console(width=None if sys.stdout.isatty() else 200).print(summary_table(result, SWE.measures,
                                                                            f"{SWE.title}: {result.extras['policy']}"))
    print(json.dumps({"workdir": workdir, **headline(result, SWE.measures[0])}, indent=2))


if __name__ == "__main__":
    app.run(recipe_main(run_eval, check, finish))
