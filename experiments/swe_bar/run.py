"""The main job: Orchard-SWE end to end (tasks, teacher trajectories, credit-assignment SFT, BAR RL,
held-out evaluation) in one command.

    python experiments/swe_bar/run.py                                   # the embedded default (tiny)
    python experiments/swe_bar/run.py --config=configs/swe_bar.py:qwen3_30b_a3b --dry-run

See configs/swe_bar.py for the variants. The run writes its ``config.json``, ends with a table, and
writes ``resolve_rate.png`` and ``summary.json`` into the workdir.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags
from rich.console import Console

from orchard.recipes.report import check_config, plot_curves, summary_table
from orchard.recipes.swe import run
from orchard.workdir import StaleStage

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "swe_bar.py")
config_flags.DEFINE_config_file("config", f"{os.path.normpath(DEFAULT_CONFIG)}:tiny", "the recipe config")
flags.DEFINE_string("workdir", "runs/swe_bar_tiny", "everything the run writes goes here")
flags.DEFINE_bool("dry-run", False, "print the resolved config, check it, and launch nothing")
flags.DEFINE_bool("rerun", False, "redo the stages whose config or inputs changed (and the ones after them) instead "
                  "of stopping")


def main(_: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every save at INFO
    config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
    if flags.FLAGS["dry-run"].value:
        print(config)
        problems = check_config(config)
        for problem in problems:
            print(f"config error: {problem}", file=sys.stderr)
        print("config OK: nothing launched (dry run)" if not problems else f"{len(problems)} config error(s)")
        sys.exit(2 if problems else 0)
    if problems := check_config(config):
        sys.exit("config errors:\n  " + "\n  ".join(problems))
    try:
        result = run(config, workdir, rerun=flags.FLAGS.rerun)
    except StaleStage as exc:
        sys.exit(f"error: {exc}")
    plot = plot_curves(result, os.path.join(workdir, "resolve_rate.png"))
    Console().print(summary_table(result))
    print(json.dumps({"workdir": workdir, "plot": plot, "held_out": result.held_out, "rl_change": result.rl_change},
                     indent=2))


if __name__ == "__main__":
    app.run(main)
