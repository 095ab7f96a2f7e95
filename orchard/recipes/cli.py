"""The command line every recipe's main job shares: ``--config`` (a ``get_config(arg)`` file and variant),
``--workdir``, ``--dry-run`` (print and check the config, launch nothing) and ``--rerun``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from absl import flags
from absl import logging as absl_logging
from ml_collections import ConfigDict, config_flags

from orchard.workdir import StaleStage


def define_recipe_flags(config_file: str, variant: str, workdir: str) -> None:
    """The flags, with the recipe's default config variant and workdir (call at import, as absl wants)."""
    config_flags.DEFINE_config_file("config", f"{config_file}:{variant}", "the recipe config")
    flags.DEFINE_string("workdir", workdir, "everything the run writes goes here")
    flags.DEFINE_bool("dry-run", False, "print the resolved config, check it, and launch nothing")
    flags.DEFINE_bool("rerun", False, "redo the stages whose config or inputs changed (and the ones after them) "
                      "instead of stopping")


def recipe_main(run: Callable[..., Any], check: Callable[[ConfigDict], list[str]],
                finish: Callable[[Any, str], None]) -> Callable[[list[str]], None]:
    """``main`` for ``app.run``: check the config (and stop there on ``--dry-run``), run the recipe, then
    ``finish(result, workdir)`` (its table, plot and headline)."""

    def main(_: list[str]) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every save at INFO
        config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
        problems = check(config)
        if flags.FLAGS["dry-run"].value:
            print(config)
            for problem in problems:
                print(f"config error: {problem}", file=sys.stderr)
            print("config OK: nothing launched (dry run)" if not problems else f"{len(problems)} config error(s)")
            sys.exit(2 if problems else 0)
        if problems:
            sys.exit("config errors:\n  " + "\n  ".join(problems))
        try:
            result = run(config, workdir, rerun=flags.FLAGS.rerun)
        except StaleStage as exc:
            sys.exit(f"error: {exc}")
        finish(result, workdir)

    return main
