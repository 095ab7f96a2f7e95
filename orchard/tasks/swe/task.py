"""SWE task instances as :class:`~orchard.harness.task.Task`\\ s: set up the repository, grade the submission.

:class:`SWETask` wraps an :class:`~orchard.tasks.swe.instance.SWEInstance`. Its ``setup`` puts the
repository into the sandbox (:func:`~orchard.tasks.swe.workspace.setup_workspace`); its ``grade``
grades the episode's submission by SWE-bench's rules
(:func:`~orchard.tasks.swe.grading.grade_submission`) in a pristine copy of the set-up (the
family's ``pristine_grading``: the policy's sandbox, and whatever it left running there, is gone
by then), recording what the grader found in
``trajectory.metadata["grade"]``. The reward is the paper's environment-grounded binary reward:
+1 when the patch resolves the task, -1 otherwise.

With ``repair_tool`` the sandbox also has the command ``repair PATH:LINE``
(:func:`~orchard.tasks.swe.candidates.install_repair_tool`) and the prompt ends with what it does.

An episode that submitted nothing is unresolved without running the tests: a FAIL_TO_PASS test
fails at the base commit by definition (the generator and SWE-bench check it), so the grader
would only confirm it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchard.data.trajectory import Outcome, Trajectory
from orchard.env.client import AsyncSandbox
from orchard.harness.core import Limits
from orchard.harness.task import TaskFamily
from orchard.tasks.swe.candidates import REPAIR_TOOL_HELP, install_repair_tool
from orchard.tasks.swe.grading import grade_submission
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.workspace import SetupError, setup_workspace

# The paper runs each SWE task in a 2 vCPU / 8 GiB sandbox; the embedded tasks need far less. The
# disk quota keeps a policy that fills its disk from filling the host's (on the local backend it
# needs root, as isolation itself does without user namespaces).
SWE_FAMILY = TaskFamily("swe", sandbox={"cpu": 1.0, "memory": "2Gi", "disk": "1Gi", "ttl": 300.0, "network": "none"},
                        limits=Limits(max_turns=100, time_limit=3600.0), setup_in_files=True, pristine_grading=True)
RESOLVED, UNRESOLVED = 1.0, -1.0


@dataclass(frozen=True)
class SWETask:
    """An SWE instance as a task (see the module docstring)."""

    instance: SWEInstance
    family: TaskFamily = SWE_FAMILY
    grade_timeout: float = 900.0
    repair_tool: bool = False

    @property
    def id(self) -> str:
        return self.instance.instance_id

    @property
    def prompt(self) -> str:
        statement = self.instance.problem_statement
        return f"{statement.rstrip()}\n\n{REPAIR_TOOL_HELP}" if self.repair_tool else statement

    async def setup(self, sandbox: AsyncSandbox) -> None:
        workspace = await setup_workspace(sandbox, self.instance)
        if self.repair_tool:
            if not workspace.shims:
                raise SetupError("the repair tool needs the sandbox's tools directory on PATH, which this sandbox "
                                 "cannot write (the task's python shim is not there either)")
            await install_repair_tool(sandbox)

    def settled(self, trajectory: Trajectory) -> Outcome | None:
        """An episode that submitted nothing is unresolved (see the module docstring)."""
        if (trajectory.metadata.get("submission") or "").strip():
            return None
        trajectory.metadata["grade"] = {"instance_id": self.id, "resolved": False, "reason": "no_submission"}
        return Outcome(reward=UNRESOLVED, resolved=False)

    async def grade(self, sandbox: AsyncSandbox, trajectory: Trajectory) -> Outcome:
        if (settled := self.settled(trajectory)) is not None:
            return settled
        result = await grade_submission(sandbox, self.instance, trajectory.metadata["submission"],
                                        timeout=self.grade_timeout)
        trajectory.metadata["grade"] = result.to_dict()
        if result.reason == "tampering":
            trajectory.metadata["tampering"] = result.detail
        return Outcome(reward=RESOLVED if result.resolved else UNRESOLVED, resolved=result.resolved)


def swe_tasks(instances: Iterable[SWEInstance], family: TaskFamily = SWE_FAMILY,
              repair_tool: bool = False) -> list[SWETask]:
    """Tasks of ``instances``, all of ``family``, with or without the ``repair`` tool."""
    return [SWETask(instance, family, repair_tool=repair_tool) for instance in instances]
