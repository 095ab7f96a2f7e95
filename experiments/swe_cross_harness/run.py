"""Cross-harness training on Orchard-SWE: SFT in harness A, B or both; every arm evaluated in A, B and a
third-party harness C (orchard.recipes.cross_harness).

    python experiments/swe_cross_harness/run.py                                   # configs/swe_cross_harness.py:tiny
    python experiments/swe_cross_harness/run.py --config=configs/swe_cross_harness.py:small --workdir=runs/xh_small

Writes the workdir's ``config.json``, ``summary.json`` (the matrix and the in- to cross-harness drops) and
``matrix_<pass>.png``, and prints the summary.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from orchard.recipes.cli import log_progress
from orchard.recipes.cross_harness import run
from orchard.recipes.report import matrix_passes, plot_matrix
from orchard.recipes.swe import SWE
from orchard.workdir import StaleStage

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "swe_cross_harness.py")
config_flags.DEFINE_config_file("config", f"{os.path.normpath(DEFAULT_CONFIG)}:tiny", "the recipe config")
flags.DEFINE_string("workdir", "runs/swe_cross_harness", "everything the run writes goes here")
flags.DEFINE_bool("rerun", False, "redo the stages whose config or inputs changed instead of stopping")


def main(_: list[str]) -> None:
    log_progress()
    config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
    if problems := SWE.check_config(config):
        sys.exit("config errors:\n  " + "\n  ".join(problems))
    try:
        summary = run(config, workdir, rerun=flags.FLAGS.rerun)
    except StaleStage as exc:
        sys.exit(f"error: {exc}")
    plots = [plot_matrix(summary, os.path.join(workdir, f"matrix_{p}.png"), p) for p in matrix_passes(summary)]
    print(json.dumps({"workdir": workdir, "plots": plots, **summary}, indent=2))


if __name__ == "__main__":
    app.run(main)
