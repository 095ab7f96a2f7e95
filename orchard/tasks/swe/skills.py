"""A task set of procedurally generated repositories, split so that held-out sets measure skills.

:func:`procedural_specs` draws the repositories: training ones, in the training styles,
vocabularies and constant range; and for each held-out axis, repositories that differ from training
in that one respect only:

* ``constants``: the training styles and vocabularies, constants from an unseen range;
* ``vocabulary``: names from a vocabulary training never shows;
* ``style``: a module layout training never shows (by default helpers as static methods of classes).

:func:`split_by_skill` splits the instances generated in them:

1. Any instance whose gold line (the line the fix restores) another instance already has is dropped,
   so that no two tasks share a gold line (two bugs on one line of one helper would).
2. Instances of the held-out repositories go to their axis's set.
3. In training repositories, ``held_out_combos`` (operation, bug kind) pairs are held out: their
   instances go to ``combo``, and every other bug of those helpers is dropped, so the pair's
   operation and its bug kind are each seen in training, only never together, and no helper of the
   set is seen at all.
4. The remaining training helpers split, by helper, into ``validation`` (choose settings on it,
   never on a held-out set), RL's prompts and SFT's instances, so RL never samples a helper of any
   held-out set or of the validation set. A fraction of the SFT helpers' instances are held out by
   instance (``instance``): a diagnostic, not a headline, since a sibling bug of the same helper is
   in SFT.

Departure from the existing ``opkit`` split (:mod:`orchard.tasks.swe.taskset`): there, every bug of a
helper has the same gold line, so "held out by instance" measures recall; here gold lines are all
distinct.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from orchard.data.renaming import renamed_copy
from orchard.data.trajectory import Trajectory
from orchard.eval.splits import split_by_id
from orchard.seeds import seeded_random
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.procedural import (
    CONSTANT_RANGES,
    STYLES,
    VOCABULARY_NAMES,
    RepoSpec,
    renaming,
    repository_nouns,
    vocabulary_nouns,
    write_repository,
)
from orchard.tasks.swe.sources import RepoSource

AXES = ("constants", "vocabulary", "style")  # held out by repository; "combo" is held out inside training ones
HELD_OUT_SETS = ("combo", *AXES, "instance")


@dataclass(frozen=True)
class ProceduralConfig:
    """Generated repositories (``tasks.sources = ("procedural",)``) and their skill splits."""

    repos: int = 24  # training repositories
    helpers: int = 10  # per repository
    bugs_per_repo: int = 12  # at most, kept per repository
    styles: tuple[str, ...] = ("modules", "single", "src")
    vocabularies: tuple[str, ...] = ("garden", "workshop", "kitchen", "harbor")
    constants: str = "small"
    held_out_style: str = "classes"
    held_out_vocabulary: str = "sky"
    held_out_constants: str = "large"
    held_out_repos: int = 3  # per held-out axis; 0 leaves the axes out
    held_out_combos: int = 3  # (operation, bug kind) pairs held out of the training repositories
    validation_fraction: float = 0.1  # of the training helpers
    instance_fraction: float = 0.1  # of the SFT helpers' instances, held out by instance

    def check(self) -> None:
        for style in (*self.styles, self.held_out_style):
            if style not in STYLES:
                raise ValueError(f"tasks.procedural: unknown style {style!r}; styles: {', '.join(STYLES)}")
        for vocabulary in (*self.vocabularies, self.held_out_vocabulary):
            if vocabulary not in VOCABULARY_NAMES:
                raise ValueError(f"tasks.procedural: unknown vocabulary {vocabulary!r}; "
                                 f"vocabularies: {', '.join(VOCABULARY_NAMES)}")
        for constants in (self.constants, self.held_out_constants):
            if constants not in CONSTANT_RANGES:
                raise ValueError(f"tasks.procedural: unknown constant range {constants!r}; "
                                 f"ranges: {', '.join(CONSTANT_RANGES)}")
        if self.held_out_repos and (self.held_out_style in self.styles or self.held_out_vocabulary in
                                    self.vocabularies or self.held_out_constants == self.constants):
            raise ValueError("tasks.procedural: a held-out style, vocabulary or constant range is also a training one")
        if self.repos < 1 or self.helpers < 2 or self.bugs_per_repo < 1:
            raise ValueError("tasks.procedural: repos, helpers and bugs_per_repo must be positive (helpers >= 2)")


def procedural_specs(config: ProceduralConfig, seed: int) -> dict[str, list[RepoSpec]]:
    """The repositories of each axis (``"train"`` and :data:`AXES`), drawn from ``seed``."""
    config.check()
    rng = seeded_random(seed, "procedural-specs")
    specs: dict[str, list[RepoSpec]] = {"train": [], **{axis: [] for axis in AXES}}
    plan = [("train", index) for index in range(config.repos)]
    plan += [(axis, index) for axis in AXES for index in range(config.held_out_repos)]
    for number, (axis, index) in enumerate(plan):
        style = config.held_out_style if axis == "style" else config.styles[index % len(config.styles)]
        vocabulary = (config.held_out_vocabulary if axis == "vocabulary"
                      else config.vocabularies[(index // len(config.styles)) % len(config.vocabularies)])
        constants = config.held_out_constants if axis == "constants" else config.constants
        name = f"{rng.choice(vocabulary_nouns(vocabulary, rng))}kit{number}"
        specs[axis].append(RepoSpec(name, style, vocabulary, constants, config.helpers, seed))
    return specs


def write_sources(config: ProceduralConfig, directory: str, seed: int) -> list[RepoSource]:
    """Write every repository under ``<directory>/sources/``; their sources, each tagged with its axis."""
    return [write_repository(spec, os.path.join(directory, "sources", spec.name)).source(axis=axis)
            for axis, specs in procedural_specs(config, seed).items() for spec in specs]


def held_out_combos(count: int, pairs: Iterable[tuple[str, str]], seed: int) -> list[tuple[str, str]]:
    """Up to ``count`` of the (operation, kind) ``pairs`` the training repositories hold, with distinct
    operations and distinct kinds, each of whose operation and kind also occurs with other partners,
    so that training still sees both, apart. ``compose`` is never held out: it holds its callees'
    operations."""
    present = sorted(set(pairs))
    rng = seeded_random(seed, "held-out-combos")
    rng.shuffle(present)
    chosen: list[tuple[str, str]] = []
    for operation, kind in present:
        if len(chosen) == count:
            break
        if operation == "compose" or operation in {o for o, _ in chosen} or kind in {k for _, k in chosen}:
            continue
        left = [pair for pair in present if pair not in chosen and pair != (operation, kind)]
        if any(o == operation for o, _ in left) and any(k == kind for _, k in left):
            chosen.append((operation, kind))
    return chosen


def gold_line(instance: SWEInstance) -> str:
    return str(instance.metadata.get("original_line", "")).strip()


def helper_of(instance: SWEInstance) -> str:
    return f"{instance.metadata.get('source')}:{instance.metadata.get('path')}:{instance.metadata.get('function')}"


def _instance_id(instance: SWEInstance) -> str:
    return instance.instance_id


def _held_out_by_instance(sft: list[SWEInstance], fraction: float, seed: int
                          ) -> tuple[list[SWEInstance], list[SWEInstance]]:
    """A ``fraction`` of the SFT instances whose helper keeps another bug in SFT."""
    counts = Counter(helper_of(i) for i in sft)
    _, drawn = split_by_id([i for i in sft if counts[helper_of(i)] > 1], fraction, seed, _instance_id,
                           purpose="held-out-instances")
    held, left = [], dict(counts)
    for instance in drawn:
        if left[helper_of(instance)] > 1:
            left[helper_of(instance)] -= 1
            held.append(instance)
    ids = {i.instance_id for i in held}
    return [i for i in sft if i.instance_id not in ids], held


@dataclass(frozen=True)
class SkillSplit:
    sft: list[SWEInstance]
    rl: list[SWEInstance]
    validation: list[SWEInstance]
    held_out: dict[str, list[SWEInstance]]  # HELD_OUT_SETS -> instances
    combos: list[tuple[str, str]]
    dropped: dict[str, int] = field(default_factory=dict)  # why instances were left out -> how many


def split_by_skill(instances: Sequence[SWEInstance], config: ProceduralConfig, seed: int,
                   rl_fraction: float) -> SkillSplit:
    """The splits of the module docstring; the axis of an instance is its source's (``metadata["axis"]``)."""
    unique, seen = [], set()
    for instance in sorted(instances, key=_instance_id):
        line = gold_line(instance)
        if line not in seen:
            unique.append(instance)
            seen.add(line)
    held_out: dict[str, list[SWEInstance]] = {name: [] for name in HELD_OUT_SETS}
    training = []
    for instance in unique:
        axis = instance.metadata.get("axis", "train")
        (training if axis == "train" else held_out[axis]).append(instance)
    combos = held_out_combos(config.held_out_combos, ((i.metadata.get("operation"), i.metadata.get("kind"))
                                                      for i in training), seed)
    in_combo = [i for i in training if (i.metadata.get("operation"), i.metadata.get("kind")) in combos]
    combo_helpers = {helper_of(i) for i in in_combo}
    held_out["combo"] = in_combo
    candidates = [i for i in training if helper_of(i) not in combo_helpers]
    rest, validation = split_by_id(candidates, config.validation_fraction, seed, helper_of, purpose="validation-helpers")
    sft, rl = split_by_id(rest, rl_fraction, seed, helper_of, purpose="rl-helpers")
    sft, held_out["instance"] = _held_out_by_instance(sft, config.instance_fraction, seed)
    if not sft or (rl_fraction and not rl):
        raise ValueError(f"{len(rest)} training tasks do not split into SFT and RL tasks: add repositories "
                         "(tasks.procedural.repos) or lower the held-out fractions")
    dropped = {"shared_gold_line": len(instances) - len(unique),
               "combo_helper_siblings": len(training) - len(in_combo) - len(candidates)}
    return SkillSplit(sft, rl, validation, held_out, combos, dropped)


def renamed_runs(trajectories: Sequence[Trajectory], config: ProceduralConfig, seed: int,
                 copies: int, first: int = 0) -> list[Trajectory]:
    """``copies`` renamings of every teacher run on a training repository: its nouns and its package name
    replaced, throughout the run (task, commands, outputs), by coined ones drawn for that copy (copy indices
    ``first`` on: SFT's copies start at 0, the copy probe's after them).

    A policy trained on a few dozen repositories can fix a bug by recalling the names it has seen
    there; in a renamed copy the names are new, and only copying them from what the run has read so
    far predicts them. The copies keep their run's task id (its side of the SFT eval split)."""
    specs = {spec.name: spec for spec in procedural_specs(config, seed)["train"]}
    out: list[Trajectory] = []
    for run in trajectories:
        spec = specs.get(run.task_id.split("__")[0])
        if spec is None:
            continue
        nouns = repository_nouns(spec)
        number = spec.name.rsplit("kit", 1)[-1]
        for copy in range(first, first + copies):
            rng = seeded_random(seed, "sft-renaming", run.id, copy)
            mapping = renaming(nouns, rng)
            mapping[spec.name] = renaming([spec.name], rng, avoid=mapping.values())[spec.name] + f"kit{number}"
            out.append(renamed_copy(run, mapping, copy))
    return out
