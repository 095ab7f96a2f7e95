"""An SWE task set and its splits: the recipe's first stage.

:class:`TaskSetConfig` names where the instances come from: a file, synthetic bugs generated in the
named sources, or (``sources=("procedural",)``) in generated repositories, which split by skill
(:mod:`orchard.tasks.swe.skills`). The other sources split in three seeded steps:

1. By helper: a ``held_out_helper_fraction`` of the helpers (the function a bug was put in, see
   :func:`helper_key`) is held out with all of its bugs, in ``held_out_helpers``: no bug of those
   functions is seen in collection, SFT or RL, so these measure fixing functions never seen broken.
2. By instance: a ``held_out_fraction`` of the remaining instances is held out (``held_out``).
   Another bug of the same function may be in training, so these measure fixing a new bug in a
   function whose sibling bug may have been trained on.
3. A ``rl_fraction`` of the rest are RL's prompts only, with no teacher trajectories (the paper's RL
   set is instances not used in SFT); the others are the SFT instances.

No instance is in two sets. :func:`unseen_tests` names the by-instance held-out instances whose
failing test catches no training instance, which evaluation reports apart (at 200 ``opkit`` bugs
there are none: every helper has three or four bugs).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchard.eval.splits import split_by_id
from orchard.tasks.swe.bugs import KINDS
from orchard.tasks.swe.generate import generate_task_set
from orchard.tasks.swe.instance import SWEInstance, load_instances
from orchard.tasks.swe.skills import ProceduralConfig, write_sources
from orchard.tasks.swe.sources import resolve_source

log = logging.getLogger(__name__)


# what the instances depend on (and, with generated repositories, tasks.procedural)
GENERATION_FIELDS = ("path", "sources", "count", "kinds", "tests_visible")
PROCEDURAL = "procedural"  # tasks.sources = ("procedural",): generated repositories, split by skill (.skills)


@dataclass(frozen=True)
class TaskSetConfig:
    path: str = ""  # instances.jsonl; empty: generate synthetic bugs in ``sources``
    sources: tuple[str, ...] = ("opkit",)
    count: int = 200
    kinds: tuple[str, ...] = KINDS
    tests_visible: bool = True
    repair_tool: bool = False  # the sandbox's ``repair PATH:LINE`` command, offered in the prompt (.candidates)
    held_out_helper_fraction: float = 0.14  # of the helpers, all of whose bugs are held out (module docstring)
    held_out_fraction: float = 0.16  # of the instances left after the held-out helpers
    rl_fraction: float = 0.2
    procedural: ProceduralConfig = field(default_factory=ProceduralConfig)  # read with sources ("procedural",)

    @property
    def is_procedural(self) -> bool:
        return tuple(self.sources) == (PROCEDURAL,) and not self.path


@dataclass(frozen=True)
class TaskSplit:
    sft: list[SWEInstance]  # teacher trajectories and SFT
    rl: list[SWEInstance]  # RL's prompts (the SFT instances when rl_fraction is 0)
    held_out: list[SWEInstance]  # evaluation only, held out by instance
    unseen: frozenset[str]  # held-out instances whose failing test catches no training instance
    held_out_helpers: list[SWEInstance] = field(default_factory=list)  # evaluation only, held out by helper

    @property
    def rl_prompts(self) -> list[SWEInstance]:
        return self.rl or self.sft


def make_task_set(config: TaskSetConfig, directory: str, seed: int) -> list[SWEInstance]:
    """``config.path``'s instances, or synthetic bugs generated into ``directory`` (its
    ``instances.jsonl``, ``repos/`` and ``report.json``)."""
    if config.path:
        return load_instances(config.path)
    if config.is_procedural:
        sources = write_sources(config.procedural, directory, seed)
        count = config.procedural.bugs_per_repo * len(sources)
    else:
        sources, count = [resolve_source(name) for name in config.sources], config.count
    instances, report = generate_task_set(sources, count, directory, seed=seed, kinds=config.kinds,
                                          tests_visible=config.tests_visible)
    log.info("generated %d tasks in %.0f s (%s)", len(instances), report.seconds, report.to_dict()["by_kind"])
    return instances


def _instance_id(instance: SWEInstance) -> str:
    return instance.instance_id


def _test_key(instance: SWEInstance) -> str:
    return instance.FAIL_TO_PASS[0] if instance.FAIL_TO_PASS else instance.instance_id


def helper_key(instance: SWEInstance) -> str:
    """The function a bug was put in (``source:path:function`` from a generated instance's metadata),
    else the instance's first failing test (an instance from a file may not say where its bug is)."""
    function = instance.metadata.get("function")
    if not function:
        return _test_key(instance)
    return f"{instance.metadata.get('source', instance.repo)}:{instance.metadata.get('path', '')}:{function}"


def unseen_tests(train: Sequence[SWEInstance], held_out: Sequence[SWEInstance]) -> set[str]:
    """Ids of the held-out instances whose first failing test catches no training instance."""
    seen = {_test_key(i) for i in train}
    return {i.instance_id for i in held_out if _test_key(i) not in seen}


def split_task_set(instances: Sequence[SWEInstance], config: TaskSetConfig, seed: int) -> TaskSplit:
    """Held-out helpers, held-out instances, then SFT and RL (see the module docstring); a set too
    small to split is a clear error."""
    rest, held_out_helpers = split_by_id(instances, config.held_out_helper_fraction, seed, helper_key,
                                         purpose="held-out-helpers")
    train, held_out = split_by_id(rest, config.held_out_fraction, seed, _instance_id, purpose="held-out")
    sft, rl = split_by_id(train, config.rl_fraction, seed, _instance_id, purpose="rl-prompts")
    if not sft or (config.rl_fraction and not rl):
        raise ValueError(f"{len(train)} training tasks do not split into SFT and RL tasks: add tasks or lower "
                         "tasks.held_out_helper_fraction, tasks.held_out_fraction and tasks.rl_fraction")
    return TaskSplit(sft, rl, held_out, frozenset(unseen_tests(train, held_out)), held_out_helpers)
