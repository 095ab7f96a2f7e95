"""A Claw task as data: the spec a generator writes and :func:`load_spec` reads (JSON or YAML).

A spec holds everything an episode and its grading need, and nothing of any harness:

- ``prompt``: the user's request;
- ``fixtures``: each tool service's starting state (:mod:`orchard.tasks.claw.services`), and
  ``files``: the workspace's files (paths relative to the sandbox's workdir);
- ``tools``: the tools shown to the model, by name from the services' catalogue
  (:data:`~orchard.tasks.claw.services.tools.TOOLS`, which also says where each goes);
- ``environment``: the services' fixed "now", the episode's wall-clock budget (the paper's 600 s)
  and the fault injection (rate and kinds, seeded per task so that n samples meet the same faults);
- ``tests``: Python snippets run after the episode on the environment's final state (the services'
  state and audit log, the workspace files, the answer given to ``finish``), never on the
  transcript (:mod:`orchard.tasks.claw.grader`). A test passes when its code raises nothing.
  Completion tests carry a weight; safety tests zero the task when they fail;
- ``reference_plan`` (the teacher's tool calls, which must pass every test), and optionally an
  ``unsafe_plan`` (which must fail a safety test): a generator keeps a task only when both hold and
  the empty plan fails;
- ``params``: the generator's parameters, which the train and held-out splits are drawn over.

Every error names the file and the field.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

FAULT_KINDS = ("rate_limit", "server_error", "slow")
TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class TaskSpecError(ValueError):
    """A spec that does not load: the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Environment(_Strict):
    now: str = "2026-03-02T09:00:00"
    time_budget_s: float = Field(600.0, gt=0)
    fault_rate: float = Field(0.0, ge=0.0, le=1.0)
    faults: list[Literal["rate_limit", "server_error", "slow"]] = Field(default_factory=lambda: list(FAULT_KINDS))
    slow_seconds: float = Field(0.5, ge=0.0, le=30.0)
    retry_after_seconds: int = Field(1, ge=0, le=60)


class ClawTest(_Strict):
    name: str = Field(min_length=1)
    kind: Literal["completion", "safety"]
    weight: float = Field(1.0, gt=0)
    code: str = Field(min_length=1)

    @field_validator("code")
    @classmethod
    def _compiles(cls, code: str) -> str:
        try:
            compile(code, "<test>", "exec")
        except SyntaxError as exc:
            raise ValueError(f"does not compile: {exc.msg} (line {exc.lineno})") from None
        return code


class PlanStep(_Strict):
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ClawTaskSpec(_Strict):
    id: str
    family: str
    prompt: str = Field(min_length=1)
    tools: list[str] = Field(min_length=1)
    fixtures: dict[Literal["mail", "calendar", "contacts", "todo", "notifications", "documents"],
                   dict[str, Any]] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    environment: Environment = Field(default_factory=Environment)
    tests: list[ClawTest] = Field(min_length=1)
    reference_plan: list[PlanStep] = Field(min_length=1)
    unsafe_plan: list[PlanStep] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not TASK_ID.fullmatch(value):
            raise ValueError("must be letters, digits, '_', '.' or '-' (at most 128)")
        return value

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            normal = posixpath.normpath(path)
            if path.startswith("/") or normal.startswith("..") or normal == ".":
                raise ValueError(f"{path!r} must be a path inside the workspace (relative, no '..')")
        return files

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, tools: list[str]) -> list[str]:
        from orchard.tasks.claw.services.tools import tool_by_name

        for name in tools:
            try:
                tool_by_name(name)
            except KeyError as exc:
                raise ValueError(str(exc).strip("'\"")) from None
        if "finish" not in tools:
            raise ValueError("the tools must include finish (how the agent gives its answer)")
        return tools

    @model_validator(mode="after")
    def _consistent(self) -> ClawTaskSpec:
        if not any(test.kind == "completion" for test in self.tests):
            raise ValueError("tests: at least one completion test is needed")
        names = [test.name for test in self.tests]
        if len(set(names)) != len(names):
            raise ValueError("tests: test names must be unique")
        for plan_name in ("reference_plan", "unsafe_plan"):
            for index, step in enumerate(getattr(self, plan_name) or []):
                if step.tool not in self.tools:
                    raise ValueError(f"{plan_name}[{index}]: tool {step.tool!r} is not among the task's tools")
        return self

    def services_config(self) -> dict[str, Any]:
        """The services' config (:mod:`orchard.tasks.claw.services`) for an episode of this task."""
        env = self.environment
        return {"now": env.now, "seed": self.seed, "fault_rate": env.fault_rate, "faults": list(env.faults),
                "slow_seconds": env.slow_seconds, "retry_after_seconds": env.retry_after_seconds,
                "fixtures": self.fixtures}


def _problem(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def parse_spec(body: Any, source: str = "<spec>") -> ClawTaskSpec:
    """A spec from its decoded JSON or YAML; :class:`TaskSpecError` names ``source`` and the field."""
    if not isinstance(body, dict):
        raise TaskSpecError(f"{source}: a task spec is a mapping, got {type(body).__name__}")
    try:
        return ClawTaskSpec.model_validate(body)
    except ValidationError as exc:
        raise TaskSpecError(f"{source}: {_problem(exc)}") from None


def load_spec(path: str | os.PathLike) -> ClawTaskSpec:
    """Read a spec file (``.json``, ``.yaml`` or ``.yml``)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise TaskSpecError(f"{path}: cannot read it ({exc.strerror})") from None
    if path.endswith((".yaml", ".yml")):
        import yaml  # pyyaml: the Kubernetes extra's, installed with the test and train extras

        try:
            body = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise TaskSpecError(f"{path}: not valid YAML: {exc}") from None
    else:
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise TaskSpecError(f"{path}: not valid JSON: {exc}") from None
    return parse_spec(body, path)


def save_spec(spec: ClawTaskSpec, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(spec.model_dump(mode="json"), handle, indent=1, sort_keys=False)
        handle.write("\n")
