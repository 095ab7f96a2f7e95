"""An SWE task set and its splits: the recipe's first stage.

:class:`TaskSetConfig` names where the instances come from (a file, or synthetic bugs generated in
the named sources) and how they split: a seeded ``held_out_fraction`` of the instances is held out
(never seen in collection, SFT or RL), and a ``rl_fraction`` of the rest are RL's prompts only,
with no teacher trajectories (the paper's RL set is instances not used in SFT).

The held-out split is by instance, not by the test that catches a bug: another bug of the same
function may be in training. :func:`unseen_tests` names the held-out instances whose failing test
catches no training instance (for ``opkit``: helpers never seen broken), which evaluation reports
apart.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from orchard.eval.splits import split_by_id
from orchard.tasks.swe.bugs import KINDS
from orchard.tasks.swe.generate import generate_task_set
from orchard.tasks.swe.instance import SWEInstance, load_instances
from orchard.tasks.swe.sources import resolve_source

log = logging.getLogger(__name__)


GENERATION_FIELDS = ("path", "sources", "count", "kinds", "tests_visible")  # what the instances depend on


@dataclass(frozen=True)
class TaskSetConfig:
    path: str = ""  # instances.jsonl; empty: generate synthetic bugs in ``sources``
    sources: tuple[str, ...] = ("opkit",)
    count: int = 200
    kinds: tuple[str, ...] = KINDS
    tests_visible: bool = True
    held_out_fraction: float = 0.16
    rl_fraction: float = 0.2


@dataclass(frozen=True)
class TaskSplit:
    sft: list[SWEInstance]  # teacher trajectories and SFT
    rl: list[SWEInstance]  # RL's prompts (the SFT instances when rl_fraction is 0)
    held_out: list[SWEInstance]  # evaluation only
    unseen: frozenset[str]  # held-out instances whose failing test catches no training instance

    @property
    def rl_prompts(self) -> list[SWEInstance]:
        return self.rl or self.sft


def make_task_set(config: TaskSetConfig, directory: str, seed: int) -> list[SWEInstance]:
    """``config.path``'s instances, or synthetic bugs generated into ``directory`` (its
    ``instances.jsonl``, ``repos/`` and ``report.json``)."""
    if config.path:
        return load_instances(config.path)
    instances, report = generate_task_set([resolve_source(name) for name in config.sources], config.count,
                                          directory, seed=seed, kinds=config.kinds,
                                          tests_visible=config.tests_visible)
    log.info("generated %d tasks in %.0f s (%s)", len(instances), report.seconds, report.to_dict()["by_kind"])
    return instances


def _instance_id(instance: SWEInstance) -> str:
    return instance.instance_id


def _test_key(instance: SWEInstance) -> str:
    return instance.FAIL_TO_PASS[0] if instance.FAIL_TO_PASS else instance.instance_id


def unseen_tests(train: Sequence[SWEInstance], held_out: Sequence[SWEInstance]) -> set[str]:
    """Ids of the held-out instances whose first failing test catches no training instance."""
    seen = {_test_key(i) for i in train}
    return {i.instance_id for i in held_out if _test_key(i) not in seen}


def split_task_set(instances: Sequence[SWEInstance], config: TaskSetConfig, seed: int) -> TaskSplit:
    """Held out, then SFT and RL (see the module docstring); a set too small to split is a clear error."""
    train, held_out = split_by_id(instances, config.held_out_fraction, seed, _instance_id)
    sft, rl = split_by_id(train, config.rl_fraction, seed + 1, _instance_id)
    if not sft or (config.rl_fraction and not rl):
        raise ValueError(f"{len(train)} training tasks do not split into SFT and RL tasks: add tasks or lower "
                         "tasks.held_out_fraction and tasks.rl_fraction")
    return TaskSplit(sft, rl, held_out, frozenset(unseen_tests(train, held_out)))
