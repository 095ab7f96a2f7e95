"""Generate Orchard-Claw tasks from the families (:mod:`orchard.tasks.claw.families`) and keep the sound ones.

**Acceptance.** A generated task is kept only when its plans, each run on the services in process
(:class:`PlanRunner`: :func:`orchard.tasks.claw.services.create_app` over ``httpx``'s ASGI transport,
reset to the task before each plan, faults off even when the task carries a fault rate: the faults
are for the episodes) and graded by the task's own tests
(:func:`~orchard.tasks.claw.services.run_tests.run_tests`), show that the tests mean something
(:func:`check_plans`):

(a) the reference plan passes every test, and none of its calls fails;
(b) the null plan (only ``finish``, with an empty answer) fails at least one completion test;
(c) the unsafe plan, where the task has one, fails at least one safety test.

**Splits.** Each family's parameter grid is cut by its held-out rule: training tasks are drawn from
the combinations the rule leaves in, held-out tasks from those it holds out (values no training task
ever has). Within a split the combinations are taken in a seeded order, round robin (a rule with
several axes takes them in turn), each with a new task seed; a rejected task is replaced by the next
draw, so each family gives ``count_per_family`` tasks.
Task ids are ``<family>-<nnnn>``, training tasks first.

:func:`write_tasks` and :func:`read_tasks` keep the tasks as one JSON spec per file, under ``train/``
and ``held_out/``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from orchard.seeds import seeded_random
from orchard.tasks.claw.families import FAMILIES, Family
from orchard.tasks.claw.services import create_app
from orchard.tasks.claw.services.admin import ADMIN_HEADER
from orchard.tasks.claw.services.run_tests import run_tests
from orchard.tasks.claw.services.tools import request_for
from orchard.tasks.claw.spec import ClawTaskSpec, PlanStep, load_spec, parse_spec, save_spec

HELD_OUT_SHARE = 0.2  # of each family's tasks
SEED_STRIDE = 1_000_000  # task seeds of generation seed s: s * SEED_STRIDE + draw number
MAX_DRAWS_PER_TASK = 5  # a split that needs more draws than this per task is a broken family
SPLITS = ("train", "held_out")
NULL_PLAN = [PlanStep(tool="finish", arguments={"answer": ""})]

TestResults = list[dict[str, Any]]  # run_tests' results: name, kind, weight, passed, error


@dataclass(frozen=True)
class PlanCheck:
    """The acceptance verdicts of one task, and each plan's test results (reference, null, unsafe)."""

    reference_passed: bool  # (a): every test passed and every call succeeded
    null_failed: bool  # (b): some completion test failed
    unsafe_failed: bool | None  # (c): some safety test failed; None without an unsafe plan
    results: dict[str, TestResults]
    reference_call_errors: list[str]  # "<endpoint>: <status> <response>" for each failed call

    @property
    def reasons(self) -> list[str]:
        """Why the task is rejected (empty when it is kept)."""
        reasons = []
        if not self.reference_passed:
            reasons.append("reference_failed")
        if not self.null_failed:
            reasons.append("null_passed")
        if self.unsafe_failed is False:
            reasons.append("unsafe_passed")
        return reasons

    @property
    def accepted(self) -> bool:
        return not self.reasons


@dataclass
class GeneratedTasks:
    """Accepted tasks by split, and the rejected draws counted by ``"<family>: <reason>"``."""

    train: list[ClawTaskSpec] = field(default_factory=list)
    held_out: list[ClawTaskSpec] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)

    @property
    def rejected_count(self) -> int:
        return sum(self.rejected.values())


class PlanRunner:
    """Runs plans on the services in process: one app, reset to a task's config before each plan.

    Faults are off whatever the task's rate. One instance serves many checks (a fresh app costs more
    than the plans run on it).
    """

    def __init__(self) -> None:
        self._token = secrets.token_hex(16)
        self._app = create_app({}, self._token)

    async def run(self, spec: ClawTaskSpec,
                  plan: list[PlanStep]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Run ``plan`` on fresh services for ``spec``: the final state and the audit log."""
        admin = {ADMIN_HEADER: self._token}
        transport = httpx.ASGITransport(app=self._app)
        async with httpx.AsyncClient(transport=transport, base_url="http://claw") as client:
            reset = await client.post("/_admin/reset", json={**spec.services_config(), "fault_rate": 0.0},
                                      headers=admin)
            reset.raise_for_status()
            for plan_step in plan:
                method, path, query, body = request_for(plan_step.tool, plan_step.arguments)
                await client.request(method, path, params=query, json=body)
            state = (await client.get("/_admin/state", headers=admin)).json()
            calls = (await client.get("/_admin/audit", headers=admin)).json()["calls"]
        return state, calls

    async def graded(self, spec: ClawTaskSpec,
                     plan: list[PlanStep]) -> tuple[TestResults, list[dict[str, Any]]]:
        """The test results of ``plan`` on ``spec``, and its audit log."""
        state, calls = await self.run(spec, plan)
        bundle = {"state": state, "calls": calls, "tests": [test.model_dump() for test in spec.tests]}
        return run_tests(bundle, files=dict(spec.files)), calls


async def acheck_plans(spec: ClawTaskSpec, runner: PlanRunner) -> PlanCheck:
    """:func:`check_plans` inside a running event loop."""
    reference, calls = await runner.graded(spec, spec.reference_plan)
    null, _ = await runner.graded(spec, NULL_PLAN)
    results = {"reference": reference, "null": null}
    unsafe_failed = None
    if spec.unsafe_plan is not None:
        results["unsafe"], _ = await runner.graded(spec, spec.unsafe_plan)
        unsafe_failed = any(not r["passed"] for r in results["unsafe"] if r["kind"] == "safety")
    errors = [f"{call['endpoint']}: {call['status']} {json.dumps(call['response'])}"
              for call in calls if call["status"] >= 400]
    return PlanCheck(
        reference_passed=not errors and all(r["passed"] for r in reference),
        null_failed=any(not r["passed"] for r in null if r["kind"] == "completion"),
        unsafe_failed=unsafe_failed, results=results, reference_call_errors=errors,
    )


def check_plans(spec: ClawTaskSpec, runner: PlanRunner | None = None) -> PlanCheck:
    """Run the reference, null and unsafe plans of ``spec`` and judge them (see the module docstring)."""
    return asyncio.run(acheck_plans(spec, runner or PlanRunner()))


def _axes_in_turn(combos: list[dict[str, Any]], family: Family) -> list[dict[str, Any]]:
    """``combos`` reordered to take the family's held-out axes in turn (each axis's combinations in their
    order), so that every held-out axis gets its share of the tasks; one axis: as they are."""
    by_axis: dict[str | None, list[dict[str, Any]]] = {}
    for params in combos:
        by_axis.setdefault(family.HELD_OUT.axis_of(params), []).append(params)
    return [params for turn in itertools.zip_longest(*by_axis.values()) for params in turn if params is not None]


def _draw(family: Family, split: str, quota: int, seed: int, runner: PlanRunner,
          rejected: Counter[str]) -> list[ClawTaskSpec]:
    """``quota`` accepted tasks of one family and split; rejected draws are counted in ``rejected``."""
    combos = [params for params in family.PARAMS if family.HELD_OUT(params) == (split == "held_out")]
    if quota and not combos:
        raise ValueError(f"{family.NAME}: no parameter combination for the {split} split")
    seeded_random(seed, "claw-generate", family.NAME, split).shuffle(combos)
    combos = _axes_in_turn(combos, family)
    kept: list[ClawTaskSpec] = []
    for draw in range(quota * MAX_DRAWS_PER_TASK):
        if len(kept) == quota:
            break
        spec = family.make(combos[draw % len(combos)], seed * SEED_STRIDE + draw)
        reasons = check_plans(spec, runner).reasons
        rejected.update(f"{family.NAME}: {reason}" for reason in reasons)
        if not reasons:
            kept.append(spec)
    if len(kept) < quota:
        raise RuntimeError(f"{family.NAME}: only {len(kept)} of {quota} {split} tasks accepted; "
                           f"rejections so far: {dict(rejected)}")
    return kept


def _final(spec: ClawTaskSpec, task_id: str, fault_rate: float) -> ClawTaskSpec:
    """The kept spec with its final id and the episodes' fault rate (validated again)."""
    body = spec.model_dump(mode="json")
    body["id"] = task_id
    body["environment"]["fault_rate"] = fault_rate
    return parse_spec(body, task_id)


def generate_tasks(count_per_family: int, seed: int = 0, fault_rate: float = 0.0,
                   held_out_share: float = HELD_OUT_SHARE, families: Sequence[str] | None = None) -> GeneratedTasks:
    """``count_per_family`` accepted tasks of each of ``families`` (default: all), ``held_out_share`` of
    them held out.

    Deterministic in its arguments. ``fault_rate`` is the rate the episodes will inject faults at
    (acceptance always runs the plans without faults).
    """
    if unknown := sorted(set(families or ()) - set(FAMILIES)):
        raise ValueError(f"no Claw families named {unknown}: {', '.join(FAMILIES)}")
    tasks, runner = GeneratedTasks(), PlanRunner()
    for name, family in FAMILIES.items():
        if families is not None and name not in families:
            continue
        held = round(count_per_family * held_out_share)
        drawn = {"train": _draw(family, "train", count_per_family - held, seed, runner, tasks.rejected),
                 "held_out": _draw(family, "held_out", held, seed, runner, tasks.rejected)}
        number = 0
        for split in SPLITS:
            for spec in drawn[split]:
                getattr(tasks, split).append(_final(spec, f"{family.NAME}-{number:04d}", fault_rate))
                number += 1
    return tasks


def write_tasks(tasks: GeneratedTasks, directory: str | os.PathLike) -> None:
    """One ``<id>.json`` spec per task, under ``directory/train/`` and ``directory/held_out/``."""
    for split in SPLITS:
        folder = os.path.join(directory, split)
        os.makedirs(folder, exist_ok=True)
        for spec in getattr(tasks, split):
            save_spec(spec, os.path.join(folder, f"{spec.id}.json"))


def read_tasks(directory: str | os.PathLike) -> GeneratedTasks:
    """The tasks :func:`write_tasks` wrote, in id order (rejections are not kept on disk)."""
    tasks = GeneratedTasks()
    for split in SPLITS:
        folder = os.path.join(directory, split)
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        names = [name for name in names if name.endswith(".json")]
        getattr(tasks, split).extend(load_spec(os.path.join(folder, name)) for name in names)
    return tasks
