"""The main jobs' headline results, rendered from their ``summary.json`` into the README's ``results`` section
and ``docs/benchmarks.md``'s ``recipe_results`` section (nothing else writes recipe numbers there).

    python experiments/results/run.py                  # the embedded defaults' workdirs
    python experiments/results/run.py --workdirs=swe=runs/swe_bar_tiny,claw=runs/claw_grpo_tiny

A job whose workdir has no ``summary.json`` is listed as not run.
"""

from __future__ import annotations

import datetime
import os
import platform

from absl import app, flags

from orchard.recipes.claw import CLAW
from orchard.recipes.gui import GUI
from orchard.recipes.report import results_markdown
from orchard.recipes.runner import RecipeResult
from orchard.recipes.swe import SWE
from orchard.results import write_markdown_section

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FAMILIES = {"swe": SWE, "gui": GUI, "claw": CLAW}
flags.DEFINE_list("workdirs", ["swe=runs/swe_bar_tiny", "gui=runs/gui_grpo_tiny", "claw=runs/claw_grpo_tiny"],
                  "job=workdir pairs; the job names its family (swe, gui, claw)")
flags.DEFINE_string("readme", os.path.join(ROOT, "README.md"), "the README whose results section is rewritten")
flags.DEFINE_string("markdown", os.path.join(ROOT, "docs", "benchmarks.md"), "the benchmarks page")


def main(_: list[str]) -> None:
    found, missing = {}, []
    for pair in flags.FLAGS.workdirs:
        job, _, workdir = pair.partition("=")
        if job not in FAMILIES:
            raise app.UsageError(f"unknown job {job!r}: one of {', '.join(FAMILIES)}")
        if os.path.exists(os.path.join(workdir, "summary.json")):
            found[job] = RecipeResult.load(workdir)
        else:
            missing.append(f"{job} ({workdir})")
    body = results_markdown(found, {job: FAMILIES[job].measures[0] for job in found}) if found else ""
    stamp = (f"Written by `python experiments/results/run.py` on {datetime.date.today()}, {platform.machine()}, "
             f"{os.cpu_count()} cores, from the main jobs' `summary.json`.")
    if missing:
        stamp += " Not run yet: " + ", ".join(missing) + " (`make run` runs the SWE job)."
    for path, name in ((flags.FLAGS.readme, "results"), (flags.FLAGS.markdown, "recipe_results")):
        write_markdown_section(path, name, f"{body}\n\n{stamp}" if body else stamp)
    print(body or stamp)


if __name__ == "__main__":
    app.run(main)
