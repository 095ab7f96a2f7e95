"""A Claw task run by mini-swe-agent's own loop (a harness no one here wrote), graded from the environment.

:func:`run_claw_instance` sets the task up in a fresh sandbox (services, CLIs, workspace), runs
mini-swe-agent through :class:`~orchard.harness.adapters.mini_swe_agent.OrchardEnvironment` with its
shell commands reaching the services through the task's command-line tools, then grades the sandbox's
state with the task's tests (:meth:`~orchard.tasks.claw.task.ClawTask.grade`), exactly as Orchard's own
harnesses are graded: what the agent said is never read. Pointed at a recording proxy session, every
model call is recorded for training (:mod:`orchard.rollout.proxy`).

The prompt keeps mini-swe-agent's own rules for actions (the config's instance template from its
``## Command Execution Rules`` on) and replaces its software-engineering preamble with the task and the
tools' usage.
"""

from __future__ import annotations

import copy
import logging
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchard.data.trajectory import Outcome, Trajectory, load_trajectory
from orchard.env.client import SandboxClient
from orchard.harness.adapters.mini_swe_agent import OrchardEnvironment, get_agent, get_model, load_config
from orchard.tasks.claw.task import ClawTask, workdir_of

log = logging.getLogger(__name__)

HARNESS = "mini-swe-agent"
RULES = "## Command Execution Rules"
PREAMBLE = """You are a personal assistant. The user asks: {{task}}

The user's mail, calendar, contacts, to-do list, notifications and documents are reached through shell \
commands, one per action: run `claw-tools` to list them and `COMMAND --help` for a command's options. They \
print JSON. A command may fail (a rate limit, a server error): read the error, then retry or work around it. \
Never do what the user did not ask for.

When the task is done, give the user a short answer with `finish --answer "..."`, then end with \
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` as a command of its own.

"""


@dataclass(frozen=True)
class ClawAgentRun:
    """What :func:`run_claw_instance` returns."""

    exit_status: str  # mini-swe-agent's (Submitted, LimitsExceeded, ...) or an exception's name
    record: dict[str, Any]  # mini-swe-agent's own trajectory
    trajectory: Trajectory  # the same run as an Orchard trajectory, outcome from the task's tests


def claw_config(name: str = "mini") -> dict[str, Any]:
    """A shipped mini-swe-agent config with the Claw preamble in its instance template."""
    config = load_config(name)
    template = config["agent"]["instance_template"]
    config["agent"]["instance_template"] = PREAMBLE + (template[template.index(RULES):] if RULES in template else "")
    return config


def run_claw_instance(client: SandboxClient, task: ClawTask, model: Any = None, *,
                      config: Mapping[str, Any] | None = None) -> ClawAgentRun:
    """Run mini-swe-agent on ``task`` in a fresh sandbox of ``client``, then grade the sandbox's state.

    ``config`` defaults to :func:`claw_config`; its ``model`` section builds the model when ``model``
    is None. An exception in the agent's run (its model failing, the sandbox failing) does not
    propagate: the trajectory is ``aborted`` and ungraded (reward ``None``), with ``metadata["error"]``.
    """
    config = copy.deepcopy(dict(config)) if config is not None else claw_config()
    if model is None:
        model = get_model(config=config.get("model", {}))
    error: str | None = None
    with client.create(**task.family.sandbox) as sandbox:
        sandbox.run_async(task.setup)
        env_config = {k: v for k, v in config.get("environment", {}).items() if k != "environment_class"}
        env = OrchardEnvironment(sandbox=sandbox, **{**env_config, "cwd": workdir_of(sandbox)})
        agent = get_agent(model, env, config.get("agent", {}), default_type="default")
        try:
            exit_status = agent.run(task.prompt).get("exit_status", "")
        except Exception as exc:
            log.warning("mini-swe-agent aborted on %s: %s: %s", task.id, type(exc).__name__, exc)
            exit_status, error = type(exc).__name__, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        record = agent.serialize({"info": {"exit_status": exit_status}, "instance_id": task.id})
        converted = load_trajectory(record, task_id=task.id, harness=HARNESS)
        if error is None:
            outcome = sandbox.run_async(task.grade, converted)
        else:
            outcome = Outcome(reward=None, resolved=False)
            converted.metadata["error"] = error
    trajectory = converted.model_copy(update={"outcome": outcome.model_copy(
        update={"status": "aborted" if error else converted.outcome.status})})
    return ClawAgentRun(exit_status, record, trajectory)
