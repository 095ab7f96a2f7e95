"""mini-swe-agent in Orchard Env sandboxes: its ``Environment`` protocol over an Orchard ``Sandbox``.

mini-swe-agent (``pip install mini-swe-agent``; written against 2.4.6) runs its own loop: its
``DefaultAgent`` renders its prompts, asks its model, parses actions and records the trajectory.
Orchard only executes. :class:`OrchardEnvironment` is the environment the agent talks to, and
:func:`run_swe_instance` runs the agent on an Orchard SWE task and grades what it submits.

.. code-block:: python

    from minisweagent.agents.default import DefaultAgent
    from orchard.harness.adapters.mini_swe_agent import OrchardEnvironment, load_config

    with client.create(memory="2Gi") as sandbox:          # a sync orchard.env.SandboxClient
        env = OrchardEnvironment(sandbox=sandbox, cwd="/workspace", timeout=60)
        agent = DefaultAgent(model, env, **load_config("mini")["agent"])
        agent.run("Make the tests pass")

An SWE task run end to end with it (set up, its loop, graded) is
:func:`orchard.tasks.swe.mini_swe_agent.run_swe_instance`.

The protocol, as mini-swe-agent 2.4.6's own environments (``local``, ``docker``) implement it:

* ``execute(action, cwd="", *, timeout=None) -> dict``. ``action`` is what the model's parser
  produced: ``{"command": ...}``, plus ``"tool_call_id"`` in the tool-calling format (2.x's
  default). The answer is ``{"output", "returncode", "exception_info"}``, ``output`` holding stdout
  and stderr *interleaved* (they run commands with ``stderr=STDOUT``). Here the command runs as
  ``/bin/sh -c 'exec "$@" 2>&1' sh <interpreter...> <command>``, which points the command's stderr
  at its stdout pipe before the interpreter (``bash -c``, as in the docker environment) starts, so
  the order is kept.
* **Submission is detected by the environment**, not the agent: an output whose first line
  (after leading whitespace) is ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, from a command that
  exited 0, raises ``minisweagent.exceptions.Submitted``; the rest of the output is the submission
  (in SWE-bench configs, a ``git diff``). Reproduced here exactly.
* **Timeouts** are observations, not exceptions: ``returncode -1``, the partial output, and
  ``exception_info`` ``"An error occurred while executing the command: Command '...' timed out
  after N seconds"`` with ``extra = {"exception_type": "TimeoutExpired", "exception": ...}`` (the
  message of the ``subprocess.TimeoutExpired`` they catch). Orchard's exec returns
  ``timed_out=True`` with the partial output after killing the process group; the same
  ``TimeoutExpired`` is built from it and reported identically, so the model sees the same text.
* **Sandbox failures are not observations.** mini-swe-agent's environments turn any exception into
  a ``returncode -1`` observation; here Orchard's typed errors (the sandbox is gone, the
  orchestrator is unreachable, ``cwd`` does not exist) propagate: the model cannot fix them, and
  continuing would spend the step budget against a dead sandbox. ``DefaultAgent.run`` records an
  ``exit`` message named after the exception and re-raises; :func:`run_swe_instance` then returns an
  ``aborted`` trajectory, as mini-swe-agent's own batch runner records such a run.
* ``get_template_vars()`` feeds the prompt templates (``mini.yaml`` prints ``{{system}}``,
  ``{{release}}``, ``{{machine}}``...). The docker environment reports the *host's*
  ``platform.uname()``; here the fields come from ``uname`` inside the sandbox, asked once.
* ``serialize()`` goes into the trajectory under ``info.config``: the environment's config, its
  class, and the sandbox's id and spec.

The agent's ``serialize()`` is a ``trajectory_format: mini-swe-agent-1.1`` record (unchanged in
2.x): ``info`` (``exit_status``, ``submission``, ``model_stats``, configs) and ``messages``, ending
with a ``role: exit`` message. :func:`orchard.data.trajectory.load_trajectory` reads it; the
outcome (resolved, reward) comes from Orchard's grading.

Models. ``DefaultAgent`` takes any mini-swe-agent model. For an OpenAI-compatible endpoint
(``orchard serve`` or vLLM), use litellm's ``openai/<served name>`` with ``api_base``:

.. code-block:: python

    from minisweagent.models import get_model

    model = get_model(config={
        "model_name": "openai/Qwen/Qwen3-8B",            # openai/ + the name the server serves
        "model_kwargs": {"api_base": "http://127.0.0.1:8000/v1", "api_key": "unused",
                         "temperature": 0.7, "drop_params": True},
        "cost_tracking": "ignore_errors",  # litellm has no price for a local model: without this, a RuntimeError
    })

``get_model`` picks ``LitellmModel``: the ``bash`` tool through tool calls (pair it with
``load_config("swebench")``); the served chat format must speak tools (Qwen3 does, SmolLM2's ChatML
does not). For a model without tools add ``"model_class": "litellm_textbased"`` and use
``load_config("swebench_backticks")``: actions in ````` ```mswea_bash_command ````` blocks. With a
local model the cost is 0, so ``agent.cost_limit`` never stops a run: set ``agent.step_limit``
(``swebench.yaml`` says 250). ``run_swe_instance(client, instance, config=cfg)`` with
``cfg["model"]`` set that way builds the model itself.
"""

from __future__ import annotations

import copy
import logging
import os
import platform
import subprocess
from collections.abc import Mapping
from typing import Any

from minisweagent.agents import get_agent
from minisweagent.config import get_config_from_spec
from minisweagent.exceptions import Submitted
from minisweagent.models import get_model
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel, ConfigDict, Field

from orchard.env.api import DEFAULT_MAX_OUTPUT_BYTES
from orchard.env.client import Sandbox, SandboxClient

log = logging.getLogger(__name__)
__all__ = ["OrchardEnvironment", "OrchardEnvironmentConfig", "get_agent", "get_model", "load_config"]

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's submission line
# Runs `<interpreter...> <command>` with its stderr on its stdout pipe, like their stderr=STDOUT.
_MERGE_STDERR = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh"]
_UNAME = ("system", "node", "release", "version", "machine", "processor")


class OrchardEnvironmentConfig(BaseModel):
    """Settings of :class:`OrchardEnvironment`.

    ``cwd``, ``env``, ``forward_env``, ``timeout`` and ``interpreter`` mean what they mean in
    mini-swe-agent's ``DockerEnvironmentConfig``, so the ``environment`` section of a mini-swe-agent
    config (less its ``environment_class``) loads as is. Unknown keys are an error.
    """

    model_config = ConfigDict(extra="forbid")

    cwd: str = ""
    """Working directory of commands; empty: the sandbox's workdir (``SandboxSpec.workdir``)."""
    env: dict[str, str] = {}
    """Environment variables of every command (over the sandbox's own)."""
    forward_env: list[str] = []
    """Names of variables of this process to pass on when set (``env`` wins over them)."""
    timeout: int = Field(30, gt=0)
    """Seconds before a command's process group is killed (an int, as in mini-swe-agent)."""
    interpreter: list[str] = Field(default_factory=lambda: ["bash", "-c"], min_length=1)
    """The command is appended to this argv; mini-swe-agent's SWE-bench configs use ``bash -c``."""
    max_output_bytes: int = Field(DEFAULT_MAX_OUTPUT_BYTES, ge=0)
    """Output kept per command (Orchard keeps the first and last halves and marks the cut)."""
    sandbox_spec: dict[str, Any] = {}
    """``SandboxSpec`` fields (cpu, memory, ttl, network, ...) of a sandbox this environment creates."""
    orchestrator_url: str = ""
    """Where to create that sandbox when no client is given; the API key is read from
    ``$ORCHARD_API_KEY`` and never stored here (this config is written into trajectories)."""


def _command(action: Mapping[str, Any] | str) -> str:
    """The shell command of an action: mini-swe-agent 2.x passes ``{"command": ...}``, 1.x a string."""
    if isinstance(action, str):
        return action
    if isinstance(action, Mapping):
        command = action.get("command", "")
        if isinstance(command, str):
            return command
        raise TypeError(f"the action's command must be a string, got {type(command).__name__}")
    raise TypeError(f"an action is a dict with a 'command' (or a command string), got {type(action).__name__}")


class OrchardEnvironment:
    """mini-swe-agent's ``Environment`` over one Orchard sandbox (the sync SDK: the agent loop is sync).

    Give it a ``sandbox`` (the caller keeps it and deletes it), or let it create one with
    ``client`` (or ``config.orchestrator_url``) from ``config.sandbox_spec``; then :meth:`cleanup`, or
    leaving a ``with`` block, deletes it. There is no ``__del__``: a sandbox that is never cleaned up
    stops getting heartbeats when this process exits, and the orchestrator reaps it after its ``ttl``.
    """

    def __init__(self, *, sandbox: Sandbox | None = None, client: SandboxClient | None = None,
                 config_class: type[OrchardEnvironmentConfig] = OrchardEnvironmentConfig, **kwargs: Any) -> None:
        self.config = config_class(**kwargs)
        self._uname: dict[str, str] | None = None
        self._own_client: SandboxClient | None = None
        self._owns_sandbox = sandbox is None
        if sandbox is not None:
            if self.config.sandbox_spec:
                raise ValueError("sandbox_spec describes a sandbox this environment creates; "
                                 "it cannot apply to the sandbox given")
            self.sandbox = sandbox
            return
        if client is None:
            if not self.config.orchestrator_url:
                raise ValueError("OrchardEnvironment needs a sandbox, a client or config.orchestrator_url")
            client = self._own_client = SandboxClient(self.config.orchestrator_url)
        try:
            self.sandbox = client.create(**self.config.sandbox_spec)
        except BaseException:
            self._close_client()
            raise

    # -- the protocol
    def execute(self, action: Mapping[str, Any] | str, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run the action's command; answer as mini-swe-agent's environments do (see the module docstring).

        Raises ``Submitted`` on a submission, and Orchard's typed errors when the sandbox fails.
        """
        command = _command(action)
        timeout = timeout or self.config.timeout
        result = self.sandbox.exec([*_MERGE_STDERR, *self.config.interpreter, command],
                                   cwd=cwd or self.config.cwd or None, env=self._env(), timeout=timeout,
                                   max_output_bytes=self.config.max_output_bytes)
        text = result.stdout + result.stderr  # stderr holds only what sh said before the exec, if anything
        if result.timed_out:
            error = subprocess.TimeoutExpired(command, timeout, output=text)
            output = {"output": text, "returncode": -1,
                      "exception_info": f"An error occurred while executing the command: {error}",
                      "extra": {"exception_type": type(error).__name__, "exception": str(error)}}
        else:
            returncode = result.exit_code if result.exit_code is not None else -1
            output = {"output": text, "returncode": returncode, "exception_info": ""}
        self._check_finished(output)
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return recursive_merge(self.config.model_dump(), self._platform(), kwargs)

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {
            "environment": self.config.model_dump(mode="json"),
            "environment_type": f"{type(self).__module__}.{type(self).__name__}",
            "sandbox": {"id": self.sandbox.id, "spec": self.sandbox.info.spec.model_dump(mode="json")},
        }}}

    # -- lifecycle
    def cleanup(self) -> None:
        """Delete the sandbox if this environment created it (a given one is left alone)."""
        try:
            if self._owns_sandbox and getattr(self, "sandbox", None) is not None:
                self.sandbox.delete()
                self._owns_sandbox = False
        finally:
            self._close_client()

    def __enter__(self) -> OrchardEnvironment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()

    # -- helpers
    @staticmethod
    def _check_finished(output: dict[str, Any]) -> None:
        """mini-swe-agent's rule, verbatim: a first line that is the marker, and exit status 0."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})

    def _env(self) -> dict[str, str]:
        forwarded = {name: os.environ[name] for name in self.config.forward_env if name in os.environ}
        return {**forwarded, **self.config.env}

    def _platform(self) -> dict[str, str]:
        """``platform.uname()``'s fields as the sandbox sees them; the host's if ``uname`` fails there."""
        if self._uname is None:
            result = self.sandbox.exec(" && ".join(f"uname -{flag}" for flag in "snrvmp"), timeout=30)
            lines = result.stdout.splitlines()
            if result.ok and len(lines) == len(_UNAME):
                self._uname = dict(zip(_UNAME, lines, strict=True))
            else:
                log.warning("uname failed in sandbox %s (%s); reporting the host's", self.sandbox.id,
                            result.stderr.strip()[-200:] or f"exit {result.exit_code}")
                self._uname = {key: str(value) for key, value in platform.uname()._asdict().items()}
        return self._uname

    def _close_client(self) -> None:
        if self._own_client is not None:
            self._own_client.close()
            self._own_client = None


def load_config(name: str = "swebench") -> dict[str, Any]:
    """One of mini-swe-agent's shipped configs (``swebench``, ``swebench_backticks``, ``mini``, ...) or a
    YAML path, as a dict with ``agent``, ``environment`` and ``model`` sections (a fresh copy)."""
    return copy.deepcopy(get_config_from_spec(name))
