"""What a learner process other than the controller runs, for the whole job: the training stages the
controller leads it into (:func:`orchard.distributed.follow`), SFT and RL, until the controller releases it.

The controller runs the recipe (tasks, sandboxes, teacher, evaluation, rollouts); each trainer it calls
first tells the others to call the same trainer with the same arguments (:func:`orchard.distributed.lead`),
so every process takes part in its steps, checkpoints and exports. A recipe's main calls
:func:`follow_controller` on every process but the controller (:func:`orchard.recipes.cli.recipe_main`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from orchard.distributed import follow
from orchard.train.rl import train_rl
from orchard.train.sft import train_and_evaluate


def _rl(**arguments: Any) -> None:
    asyncio.run(train_rl(**arguments))


def follow_controller() -> None:
    """Take part in each training stage the controller leads into, until it releases this process."""
    follow({"sft": train_and_evaluate, "rl": _rl})
