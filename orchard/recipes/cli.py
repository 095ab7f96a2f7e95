"""The command line every recipe's main job shares: ``--config`` (a ``get_config(arg)`` file and variant),
``--workdir``, ``--dry-run`` (print and check the config, launch nothing) and ``--rerun``.

``--dry-run`` also prints the memory plan of every stage that trains (:func:`stage_plans`: parameters,
optimizer state, gradients and activations per device on the mesh the config names, from
``jax.eval_shape`` over an abstract mesh, :mod:`orchard.train.plan`) and checks the chain to the run
that makes the model it loads (:func:`chain_problems`); a stage that does not fit its device, an axis
that does not divide, or a broken chain fails it like a config error."""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from absl import flags
from absl import logging as absl_logging
from ml_collections import ConfigDict, config_flags
from rich.console import Console

from orchard import distributed
from orchard.config import ConfigError, from_config
from orchard.models.build import ModelSpec
from orchard.models.sharding import MeshConfig
from orchard.models.shipped import resolve
from orchard.recipes.family import Family
from orchard.recipes.report import headline, plot_curves, summary_table
from orchard.recipes.runner import RecipeResult, run
from orchard.train.follow import follow_controller
from orchard.train.plan import MemoryPlan, plan_stage
from orchard.train.state import OptimConfig
from orchard.workdir import StaleStage


def define_recipe_flags(config_file: str, variant: str, workdir: str) -> None:
    """The flags, with the recipe's default config variant and workdir (call at import, as absl wants)."""
    config_flags.DEFINE_config_file("config", f"{config_file}:{variant}", "the recipe config")
    flags.DEFINE_string("workdir", workdir, "everything the run writes goes here")
    flags.DEFINE_bool("dry-run", False, "print the resolved config, check it, and launch nothing")
    flags.DEFINE_bool("rerun", False, "redo the stages whose config or inputs changed (and the ones after them) "
                      "instead of stopping")


# Libraries whose INFO records are one a request or a start-up probe (httpx logs every call to the services and
# sandboxes, JAX each accelerator it looks for): WARNING and above only.
CHATTY_LOGGERS = ("httpx", "httpcore", "jax._src.xla_bridge")


def log_progress() -> None:
    """Log INFO and above to stderr, as a job says what it did, with absl's own records (Orbax logs every save)
    and :data:`CHATTY_LOGGERS` at WARNING only. ``app.run`` has put absl's handler on the root logger at
    WARNING, where a plain ``logging.basicConfig`` would change nothing: the stages' INFO records were dropped."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    absl_logging.set_verbosity(absl_logging.WARNING)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def recipe_main(run: Callable[..., Any], check: Callable[[ConfigDict], list[str]],
                finish: Callable[[Any, str], None]) -> Callable[[list[str]], None]:
    """``main`` for ``app.run``: check the config (and stop there on ``--dry-run``), run the recipe, then
    ``finish(result, workdir)`` (its table, plot and headline). In a multi-host learner
    (:mod:`orchard.distributed`) every process runs this main: the controller runs the recipe, the others
    follow it into its training stages."""

    def main(_: list[str]) -> None:
        log_progress()
        config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
        problems = check(config)
        if flags.FLAGS["dry-run"].value:
            dry_run(config, problems)
        if problems:
            sys.exit("config errors:\n  " + "\n  ".join(problems))
        distributed.initialize()  # a multi-host learner's processes join (nothing on one process)
        if not distributed.is_controller():
            follow_controller()  # the controller runs the recipe and leads this process into its training
            return
        logging.info("the resolved config, every field named (also written to %s/config.json):\n%s", workdir, config)
        try:
            result = run(config, workdir, rerun=flags.FLAGS.rerun)
        except StaleStage as exc:
            sys.exit(f"error: {exc}")
        finally:
            distributed.release()
        finish(result, workdir)

    return main


def family_main(family: Family) -> Callable[[list[str]], None]:
    """``main`` for a family's main job: :func:`recipe_main` over the runner, ending with the one report
    (the table, ``held_out.png`` and the headline numbers as JSON)."""

    def finish(result: RecipeResult, workdir: str) -> None:
        plot = plot_curves(result, os.path.join(workdir, "held_out.png"), family.measures[0])
        # Wide enough for the whole table when the output is a log file, not a terminal (rich's default is 80).
        Console(width=None if sys.stdout.isatty() else 200).print(summary_table(result, family.measures, family.title))
        print(json.dumps({"workdir": workdir, "plot": plot, **headline(result, family.measures[0])}, indent=2))

    return recipe_main(functools.partial(run, family), family.check_config, finish)


def dry_run(config: ConfigDict, problems: list[str]) -> None:
    """Print ``config``, the memory plan of each stage that trains and the chain check, then exit: 0
    when nothing is wrong, 2 with every problem on stderr otherwise."""
    print(config)
    if not problems:  # a config that does not type-check cannot be planned
        plans, notes = stage_plans(config)
        for plan in plans:
            print(plan.table())
        for note in notes:
            print(f"note: {note}")
        problems = [*problems, *(p for plan in plans for p in plan.problems), *chain_problems(config)]
    for problem in problems:
        print(f"config error: {problem}", file=sys.stderr)
    print("config OK: nothing launched (dry run)" if not problems else f"{len(problems)} config error(s)")
    sys.exit(2 if problems else 0)


def _vocab_size(config: ConfigDict) -> int | None:
    """A fresh model's vocabulary when ``model.init`` leaves it open: the tokenizer's (trained, or read)."""
    tokenizer = config.get("tokenizer")
    if isinstance(tokenizer, ConfigDict) and tokenizer.get("train_vocab"):
        return int(tokenizer.train_vocab)
    path = tokenizer.get("path") if isinstance(tokenizer, ConfigDict) else tokenizer
    if path and os.path.exists(resolve(path)):
        from orchard.data.tokenizer import Tokenizer

        return Tokenizer.from_pretrained(resolve(path)).vocab_size
    return None


def stage_plans(config: ConfigDict) -> tuple[list[MemoryPlan], list[str]]:
    """The :class:`~orchard.train.plan.MemoryPlan` of each stage of a recipe config that trains (``sft``
    with ``batch_size`` rows a micro-batch, ``rl`` with ``micro_rows``; a stage with no steps is skipped),
    and notes on what could not be planned."""
    try:
        spec = from_config(ModelSpec, config.model.to_dict(), "model")
        mesh = from_config(MeshConfig, config.mesh.to_dict(), "mesh")
    except ConfigError as exc:
        return [], [f"no memory plan: {exc}"]
    stages = []
    if "sft" in config and config.sft.num_steps:
        stages.append(("sft", config.sft, config.sft.batch_size))
    if "rl" in config and config.rl.num_steps:
        stages.append(("rl", config.rl, config.rl.micro_rows))
    vocab = _vocab_size(config)
    plans, notes = [], []
    for name, block, rows in stages:
        try:
            optim = from_config(OptimConfig, block.optim.to_dict(), f"{name}.optim")
            plans.append(plan_stage(name, spec, mesh, optim, rows, block.seq_len, vocab))
        except (ConfigError, ValueError) as exc:
            notes.append(f"no memory plan for {name}: {exc}")
    return plans, notes


def _plain(value: Any) -> Any:
    return value.to_dict() if isinstance(value, ConfigDict) else value


def load_config(named: str) -> ConfigDict:
    """``path/to/config.py:variant`` (relative to the working directory) -> its ``get_config(variant)``."""
    path, _, variant = named.partition(":")
    spec = importlib.util.spec_from_file_location(f"upstream_{abs(hash(path))}", path)
    if spec is None or spec.loader is None or not os.path.exists(path):
        raise FileNotFoundError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant or None)


def chain_problems(config: ConfigDict) -> list[str]:
    """A config whose model another run makes names that run's config in ``upstream``
    (``configs/swe_sft.py:qwen3_30b_a3b``): that config must export its final model to this
    ``model.path`` (its ``export``), with the architecture this config plans from (``model.init``) and
    the tokenizer this config reads. Prints what it checked."""
    upstream_name = config.get("upstream")
    if not upstream_name:
        return []
    try:
        upstream = load_config(upstream_name)
    except (FileNotFoundError, ValueError) as exc:
        return [f"upstream {upstream_name!r} cannot be read: {exc}"]
    problems = []
    export, path = upstream.get("export", ""), config.model.path
    if os.path.normpath(export or "") != os.path.normpath(path or "."):
        problems.append(f"model.path {path!r} is not where {upstream_name} exports its model (export {export!r})")
    if _plain(upstream.model.init) != _plain(config.model.init):
        problems.append(f"model.init differs from {upstream_name}'s: the planned shape is not the exported one")
    tokenizer = config.tokenizer.path if isinstance(config.tokenizer, ConfigDict) else config.tokenizer
    if tokenizer != upstream.tokenizer:
        problems.append(f"tokenizer {tokenizer!r} is not {upstream_name}'s ({upstream.tokenizer!r})")
    if not problems:
        there = "there" if os.path.exists(os.path.join(path, "config.json")) else "not there yet"
        print(f"chain: {upstream_name} exports its final model to {path!r} ({there}), which this config loads, "
              "with the same shape and tokenizer")
    return problems
