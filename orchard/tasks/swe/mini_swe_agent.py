"""An SWE task run end to end by mini-swe-agent's own loop in an Orchard sandbox, then graded.

:func:`run_swe_instance` sets the task's repository up (:func:`~orchard.tasks.swe.workspace.setup_workspace`),
runs mini-swe-agent through :class:`~orchard.harness.adapters.mini_swe_agent.OrchardEnvironment`,
grades its submission in a fresh sandbox by SWE-bench's rules, and converts its trajectory:

.. code-block:: python

    from orchard.harness.adapters.mini_swe_agent import load_config
    from orchard.tasks.swe.mini_swe_agent import run_swe_instance

    run = run_swe_instance(client, instance, config=load_config("swebench"))  # a sync SandboxClient
    run.grade.resolved, run.trajectory.outcome, run.record["trajectory_format"]
"""

from __future__ import annotations

import copy
import logging
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchard.data.trajectory import Outcome, Status, Trajectory, load_trajectory
from orchard.env.client import SandboxClient
from orchard.harness.adapters.mini_swe_agent import OrchardEnvironment, get_agent, get_model, load_config
from orchard.tasks.swe.grading import GradeResult, grade_in_fresh_sandbox
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.task import SWE_FAMILY
from orchard.tasks.swe.workspace import setup_workspace

log = logging.getLogger(__name__)

HARNESS = "mini-swe-agent"
SWE_REPO_DIR = "/testbed"  # where mini-swe-agent's SWE-bench prompts tell the model the repository is


@dataclass(frozen=True)
class MiniSweAgentRun:
    """What :func:`run_swe_instance` returns."""

    exit_status: str  # mini-swe-agent's: Submitted, LimitsExceeded, TimeExceeded, RepeatedFormatError, an error's name
    submission: str  # what the agent submitted: the patch that was graded ("" when it did not submit)
    record: dict[str, Any]  # mini-swe-agent's own trajectory (trajectory_format: mini-swe-agent-1.1)
    trajectory: Trajectory  # the same run as an Orchard trajectory, outcome from grading
    grade: GradeResult | None  # None when not graded (grade=False, or the run aborted on an error)


def _status(converted: Status, errored: bool) -> Status:
    # An exception's name can contain "timeout" (litellm's Timeout): that is still an aborted run.
    return "aborted" if errored else converted


def run_swe_instance(client: SandboxClient, instance: SWEInstance, model: Any = None, *,
                     config: Mapping[str, Any] | None = None, repo_dir: str = SWE_REPO_DIR,
                     sandbox_spec: Mapping[str, Any] | None = None, grade: bool = True) -> MiniSweAgentRun:
    """Run mini-swe-agent on ``instance`` in a fresh sandbox of ``client``, then grade its submission.

    ``config`` is a mini-swe-agent config (default: ``load_config("swebench")``): its ``agent``
    section (with an optional ``agent_class``) builds the agent, its ``environment`` section
    configures :class:`OrchardEnvironment` (``environment_class`` is ignored: the environment is
    Orchard's; ``cwd`` becomes the repository), and its ``model`` section builds the model when
    ``model`` is None.

    The repository is set up with :func:`orchard.tasks.swe.workspace.setup` at ``repo_dir``
    (``/testbed``, where SWE-bench images keep it and the ``swebench`` prompts say it is; sandboxes
    without root over ``/``, such as rootless ones, need a path under their workdir instead). The
    agent's submission, not the state of its sandbox, is what gets graded, as SWE-bench grades
    mini-swe-agent's ``preds.json``: in a fresh sandbox of the same spec
    (:func:`orchard.tasks.swe.grading.grade_in_fresh_sandbox`), so nothing the agent left behind counts.

    An exception in the agent's run (its model failing after retries, the sandbox failing) does not
    propagate: like mini-swe-agent's batch runner, the run is recorded with the exception's name as
    its exit status, and the trajectory is ``aborted``, ungraded, with ``metadata["error"]``.
    Setup and grading errors do propagate (the task, not the agent, is broken).
    """
    config = copy.deepcopy(dict(config)) if config is not None else load_config("swebench")
    if model is None:
        model = get_model(config=config.get("model", {}))
    spec = {**SWE_FAMILY.sandbox, **(sandbox_spec or {})}
    error: dict[str, str] | None = None
    with client.create(**spec) as sandbox:
        workspace = sandbox.run_async(setup_workspace, instance, repo_dir=repo_dir)
        env_config = {k: v for k, v in config.get("environment", {}).items() if k != "environment_class"}
        env_config["cwd"] = workspace.repo_dir
        if not workspace.shims:  # no python/pytest shims on PATH: every command needs the workspace's env
            env_config["env"] = {**env_config.get("env", {}), **workspace.env}
        env = OrchardEnvironment(sandbox=sandbox, **env_config)
        agent = get_agent(model, env, config.get("agent", {}), default_type="default")
        try:
            info = agent.run(instance.problem_statement)
            exit_status, submission = info.get("exit_status", ""), info.get("submission", "") or ""
        except Exception as exc:
            log.warning("mini-swe-agent aborted on %s: %s: %s", instance.instance_id, type(exc).__name__, exc)
            exit_status, submission = type(exc).__name__, ""
            error = {"exception_str": str(exc), "traceback": traceback.format_exc()}
        record = agent.serialize({"info": {"exit_status": exit_status, "submission": submission, **(error or {})},
                                  "instance_id": instance.instance_id})
    graded = client.run_async(grade_in_fresh_sandbox, instance, submission, **spec) if grade and error is None else None
    converted = load_trajectory(record, task_id=instance.instance_id, harness=HARNESS)
    outcome = Outcome(reward=graded.reward if graded else 0.0, resolved=bool(graded and graded.resolved),
                      status=_status(converted.outcome.status, error is not None))
    metadata = {**converted.metadata, "instance_id": instance.instance_id}
    if graded is not None:
        metadata["grade"] = {"reason": graded.reason, "reward": graded.reward, **graded.counts()}
    if error is not None:
        metadata["error"] = f"{exit_status}: {error['exception_str']}"
    trajectory = converted.model_copy(update={"outcome": outcome, "metadata": metadata})
    return MiniSweAgentRun(exit_status, submission, record, trajectory, graded)
