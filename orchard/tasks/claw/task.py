"""A Claw task in a sandbox: its tool services, workspace and tools on set-up; its tests on grading.

**Set-up** (:meth:`ClawTask.setup`) puts into a fresh sandbox:

- the services package (:mod:`orchard.tasks.claw.services`, self-contained) under :data:`SERVICES_ROOT`,
  started as one process on the sandbox's loopback (:data:`SERVICES_PORT`) with the task's config and
  an admin token only the host knows (:func:`admin_token`; handed over in a file the process deletes);
- the tools file the harnesses read (:data:`orchard.harness.claw.TOOLS_PATH`: the spec's tools with
  their HTTP bindings), and command-line tools for each of them in the sandbox's tools directory
  (:data:`~orchard.env.api.TOOLS_BIN`, first on ``PATH``; for harnesses that only run shell commands);
- the workspace files.

A pooled sandbox (the family is ``reusable``) keeps its services process: the set-up resets it to
the new task's config over the admin route and rewrites the workspace, in milliseconds.

**Grading** (:meth:`ClawTask.grade`) reads the environment, never the transcript: the services'
state and audit log over the admin route, each answer signed by the services with the admin token (a
server the policy starts on their port cannot sign: the episode is graded -1 as tampering), then every
process in the sandbox but the services and the agent is killed (nothing the policy left running can
touch what follows), the state goes into a fresh folder with a fresh copy of the test runner (the
policy may have rewritten the one set-up uploaded), and the tests run there
(:mod:`orchard.tasks.claw.services.run_tests`, ``python -I``).
The outcome: the paper's RL reward (+1 when every test passes, -1 otherwise; an episode cut by the
wall clock is never graded and has reward ``None``, as is one whose services cannot be read), and
``resolved`` when the Claw score passes (at least 0.75); the score's parts go into the trajectory's
metadata (``claw``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import os
import posixpath
import secrets
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.data.trajectory import Outcome, Trajectory
from orchard.env.api import TOOLS_BIN, TOOLS_DIR
from orchard.env.client import AsyncSandbox, OrchardError, Sandbox
from orchard.eval.claw_score import TestResult, claw_score
from orchard.harness.claw import DEFAULT_LIMITS, ROUTE_KEY, TOOLS_PATH
from orchard.harness.task import TaskFamily
from orchard.tasks.claw.services import PACKAGE_DIR, SANDBOX_NAME
from orchard.tasks.claw.services.admin import ADMIN_HEADER, SIGNATURE_HEADER, signature
from orchard.tasks.claw.services.tools import install_shims, openai_tools, tool_by_name
from orchard.tasks.claw.spec import ClawTaskSpec

SERVICES_ROOT = f"{TOOLS_DIR}/claw"
SERVICES_PORT = 8765
SHIMS_DIR = TOOLS_BIN
_SECRET = secrets.token_bytes(32)  # this process's: admin tokens are derived from it, never stored


class ForgedServices(RuntimeError):
    """What answered on the services' port is not the services Orchard started (its answers are unsigned)."""


def admin_token(sandbox_id: str) -> str:
    """The services' admin token in one sandbox: known to this process, never written where the policy reads."""
    return hmac.new(_SECRET, sandbox_id.encode(), hashlib.sha256).hexdigest()


def claw_family(time_budget_s: float = 600.0) -> TaskFamily:
    """The Claw family: 2 vCPU and 2 GiB as the paper's sandboxes, no network (the services are on the
    sandbox's loopback), no step cap and the wall-clock budget; ``reusable`` (see the module docstring)."""
    return TaskFamily(name="claw", sandbox={"cpu": 2.0, "memory": "2Gi", "pids": 512, "network": "none",
                                            "ttl": time_budget_s + 300.0},
                      limits=dataclasses.replace(DEFAULT_LIMITS, time_limit=time_budget_s), reusable=True)


def workdir_of(sandbox: AsyncSandbox | Sandbox) -> str:
    """Where a sandbox's commands start, and a task's files go."""
    return sandbox.info.spec.workdir or "/workspace"


def tools_file(spec: ClawTaskSpec) -> list[dict[str, Any]]:
    """The spec's tools as the harnesses read them: OpenAI schemas with their HTTP bindings."""
    listed = []
    for schema in openai_tools(spec.tools):
        tool = tool_by_name(schema["function"]["name"])
        listed.append({**schema, ROUTE_KEY: {"method": tool.method, "path": tool.path, "port": SERVICES_PORT}})
    return listed


@dataclass
class ClawTask:
    """One Claw task (its :class:`~orchard.tasks.claw.spec.ClawTaskSpec`) under the Task protocol."""

    spec: ClawTaskSpec
    python: str = sys.executable  # the interpreter inside the sandbox (local backend: this one, bound in)
    family: TaskFamily = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.family is None:
            self.family = claw_family(self.spec.environment.time_budget_s)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def prompt(self) -> str:
        return self.spec.prompt

    # ------------------------------------------------------------------ set-up

    async def setup(self, sandbox: AsyncSandbox) -> None:
        config = self.spec.services_config()
        if not await self._reset(sandbox, config):
            await self._install(sandbox, config)
        await self._write_workspace(sandbox)
        await sandbox.write_file(TOOLS_PATH, json.dumps(tools_file(self.spec)))

    async def _reset(self, sandbox: AsyncSandbox, config: dict[str, Any]) -> bool:
        """Reset the services a pooled sandbox already runs; ``False`` when none answer there."""
        try:
            reply = await sandbox.port_request(SERVICES_PORT, "POST", "/_admin/reset", json=config,
                                               headers=self._admin(sandbox))
        except OrchardError:
            return False
        if reply.status != 200:
            raise RuntimeError(f"the services would not reset: {reply.status} {reply.text[:300]}")
        return True

    async def _install(self, sandbox: AsyncSandbox, config: dict[str, Any]) -> None:
        package = posixpath.join(SERVICES_ROOT, SANDBOX_NAME)
        await sandbox.upload_dir(PACKAGE_DIR, package)
        config_path, token_path = posixpath.join(SERVICES_ROOT, "config.json"), posixpath.join(SERVICES_ROOT, "token")
        await sandbox.write_file(config_path, json.dumps(config))
        await sandbox.write_file(token_path, admin_token(sandbox.id), mode=0o600)
        await sandbox.start_process([self.python, "-m", SANDBOX_NAME, "--port", str(SERVICES_PORT), "--config",
                                     config_path, "--admin-token-file", token_path],
                                    env={"PYTHONPATH": SERVICES_ROOT}, name="claw-services")
        await self._install_shims(sandbox)
        await self._wait_healthy(sandbox)

    async def _install_shims(self, sandbox: AsyncSandbox) -> None:
        """The command-line tools, written here and copied in (their text names the sandbox's paths)."""
        with tempfile.TemporaryDirectory(prefix="orchard-claw-shims-") as local:
            for path in install_shims(local, self.python, SERVICES_ROOT):
                with open(path, "rb") as handle:
                    await sandbox.write_file(posixpath.join(SHIMS_DIR, os.path.basename(path)), handle.read(),
                                             mode=0o755)

    async def _wait_healthy(self, sandbox: AsyncSandbox, timeout: float = 120.0) -> None:
        """Until the services answer: half a second alone, much longer when dozens start on two cores."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                if (await sandbox.port_request(SERVICES_PORT, "GET", "/health")).status == 200:
                    return
            except OrchardError:
                pass
            if loop.time() > deadline:
                raise RuntimeError(f"the Claw services did not come up within {timeout:.0f} s")
            await asyncio.sleep(0.02)

    async def _write_workspace(self, sandbox: AsyncSandbox) -> None:
        workdir = workdir_of(sandbox)
        await sandbox.exec(f"find {shlex.quote(workdir)} -mindepth 1 -delete", timeout=30)  # a pooled sandbox's last
        for path, content in self.spec.files.items():
            await sandbox.write_file(posixpath.join(workdir, path), content)

    def _admin(self, sandbox: AsyncSandbox) -> dict[str, str]:
        return {ADMIN_HEADER: admin_token(sandbox.id)}

    # ----------------------------------------------------------------- grading

    def settled(self, trajectory: Trajectory) -> Outcome | None:
        return None

    async def environment_state(self, sandbox: AsyncSandbox) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The services' state and audit log, over the admin route, each checked against the services'
        signature (:class:`ForgedServices` when it does not match: something else answers on their port)."""
        token = admin_token(sandbox.id)
        replies = []
        for route in ("/_admin/state", "/_admin/audit"):
            reply = await sandbox.port_request(SERVICES_PORT, "GET", route, headers=self._admin(sandbox))
            if reply.status != 200:
                raise RuntimeError(f"the services' {route} answered {reply.status}")
            signed = {name.lower(): value for name, value in reply.headers.items()}.get(SIGNATURE_HEADER.lower(), "")
            if not hmac.compare_digest(signed, signature(token, reply.body)):
                raise ForgedServices(f"the answer of {route} does not carry the services' signature")
            replies.append(reply.json())
        return replies[0], replies[1]["calls"]

    async def grade(self, sandbox: AsyncSandbox, trajectory: Trajectory) -> Outcome:
        try:
            state, calls = await self.environment_state(sandbox)
            results = await self._run_tests(sandbox, state, calls)
        except ForgedServices as exc:  # the policy put a server of its own in the services' place
            trajectory.metadata["claw"] = {"grading_error": str(exc)}
            trajectory.metadata["tampering"] = str(exc)
            return Outcome(reward=-1.0, resolved=False, status=trajectory.outcome.status)
        except (OrchardError, RuntimeError, ValueError, KeyError) as exc:  # the environment failed, not the policy
            trajectory.metadata["claw"] = {"grading_error": f"{type(exc).__name__}: {exc}"}
            return Outcome(reward=None, resolved=False, status=trajectory.outcome.status)
        score = claw_score(results, calls)
        trajectory.metadata["claw"] = {**score.to_dict(), "tests": [r.__dict__ for r in results],
                                       "tool_calls": len(calls), "faults": sum(c.get("fault") is not None for c in calls)}
        reward = 1.0 if all(r.passed for r in results) else -1.0
        return Outcome(reward=reward, resolved=score.passed, status=trajectory.outcome.status)

    async def _run_tests(self, sandbox: AsyncSandbox, state: dict[str, Any],
                         calls: list[dict[str, Any]]) -> list[TestResult]:
        services = [p for p in await sandbox.processes() if p.running and p.name == "claw-services"]
        keep = " ".join(str(p.pid) for p in services)
        await sandbox.exec(  # every process but the agent (1), this shell and the services
            f"for p in /proc/[0-9]*; do p=${{p#/proc/}}; case \" 1 $$ {keep} \" in *\" $p \"*) ;; "
            f"*) kill -9 $p 2>/dev/null;; esac; done; true", timeout=30)
        folder = posixpath.join("/tmp", f"orchard-claw-grade-{secrets.token_hex(8)}")
        bundle = {"state": state, "calls": calls, "workdir": workdir_of(sandbox),
                  "tests": [test.model_dump() for test in self.spec.tests]}
        await sandbox.write_file(posixpath.join(folder, "bundle.json"), json.dumps(bundle))
        runner = posixpath.join(folder, "run_tests.py")  # a fresh copy: the policy could rewrite the uploaded one
        await sandbox.write_file(runner, Path(PACKAGE_DIR, "run_tests.py").read_bytes())
        done = await sandbox.exec([self.python, "-I", runner, posixpath.join(folder, "bundle.json")], timeout=60)
        if done.exit_code != 0:
            raise RuntimeError(f"the tests did not run (exit {done.exit_code}): {done.stderr[-500:]}")
        return [TestResult(r["name"], r["kind"], r["passed"], r["weight"], r["error"]) for r in json.loads(done.stdout)]
