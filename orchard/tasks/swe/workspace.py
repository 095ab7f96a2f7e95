"""Put a task's repository into a sandbox and make it runnable offline.

:func:`setup_workspace` does, in the sandbox (an :class:`~orchard.env.AsyncSandbox`; from sync code,
``sandbox.run_async(setup_workspace, instance)`` on a :class:`~orchard.env.Sandbox`):

1. **Upload** the snapshot (``instance.repo_path``: a directory, or a tarball unpacked here
   first) to ``/workspace/repo``.
2. **Commit** it as the base: ``git init``, one commit with fixed author and dates, tag
   ``orchard-base``. Harnesses get the agent's change as ``git diff orchard-base``
   (:func:`submission_patch`), and the grader restores test files from it. A snapshot that is
   already a git checkout keeps its history; its ``HEAD`` is tagged.
3. **Choose the interpreter** that runs the tests: the first of ``python3``, ``python`` and the
   caller's ``sys.executable`` that can ``import pytest`` inside the sandbox. On the local
   backend a sandbox sees the host's ``/usr/bin/python3`` (no pytest here) and, bound read-only,
   the orchestrator's virtualenv, which is the caller's when the orchestrator came from
   ``local_server()``; so the venv's interpreter is chosen, the same one the generator used to
   decide which tests fail. An image with its own Python and pytest (Kubernetes) is preferred
   automatically, because ``python3`` comes first.
4. **Install** without network: nothing is built or pip-installed (the venv is read-only, and a
   pure-Python repository needs no build); the repository is put on ``PYTHONPATH`` instead (and
   its ``src/`` too, for src layouts). ``PYTHONPATH`` comes before site-packages, so the snapshot
   shadows any installed copy of the same package (toolz in the orchestrator's venv, say).
5. **Shims**: ``python``, ``python3`` and ``pytest`` in the sandbox's tools directory
   (:data:`~orchard.env.api.TOOLS_BIN`, first on its ``PATH`` and writable under a read-only root)
   become small shell scripts that set ``PYTHONPATH`` and run the chosen interpreter, so an agent's
   plain ``pytest`` or ``python -m pytest`` works as the grader's does. Where it is not writable
   (rootless sandboxes mount the host tree read-only) no shims are written and
   :attr:`Workspace.env` is what callers pass to ``exec``.

The choices are saved in ``/workspace/repo/.git/orchard-swe.json`` so that grading in the same
sandbox needs no second probe.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from orchard.env import PathNotFound
from orchard.env.api import TOOLS_BIN
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.testlog import PYTEST_ENV

REPO_DIR = "/workspace/repo"
BASE_TAG = "orchard-base"
SHIM_DIR = TOOLS_BIN
STATE_FILE = ".git/orchard-swe.json"
_GIT_IDENTITY = {"GIT_AUTHOR_NAME": "orchard", "GIT_AUTHOR_EMAIL": "orchard@localhost",
                 "GIT_COMMITTER_NAME": "orchard", "GIT_COMMITTER_EMAIL": "orchard@localhost",
                 "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}
_IGNORED = "__pycache__/\n*.pyc\n.pytest_cache/\n"


class SetupError(RuntimeError):
    """The repository could not be put into the sandbox, or no usable Python was found there."""


@dataclass(frozen=True)
class Workspace:
    """What :func:`setup_workspace` left in a sandbox."""

    repo_dir: str
    python: str  # absolute path of the interpreter that runs the tests
    env: dict[str, str] = field(default_factory=dict)  # pass to exec when not relying on the shims
    shims: bool = False  # whether python, python3 and pytest on PATH now run ``python`` with ``env``


def snapshot_dir(repo_path: str, scratch: str) -> str:
    """The local directory holding the snapshot: ``repo_path`` itself, or a tarball unpacked in ``scratch``.

    A tarball whose members all sit under one top-level directory is unpacked from inside it.
    """
    if os.path.isdir(repo_path):
        return repo_path
    if not os.path.isfile(repo_path):
        raise SetupError(f"repository snapshot {repo_path!r} does not exist")
    try:
        with tarfile.open(repo_path) as archive:
            archive.extractall(scratch, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise SetupError(f"repository snapshot {repo_path!r} is neither a directory nor a readable tarball: "
                         f"{exc}") from None
    entries = os.listdir(scratch)
    if len(entries) == 1 and os.path.isdir(os.path.join(scratch, entries[0])):
        return os.path.join(scratch, entries[0])
    return scratch


def _python_path(repo_dir: str, has_src: bool) -> str:
    return f"{repo_dir}/src:{repo_dir}" if has_src else repo_dir


def _shim(python: str, python_path: str, module: str = "") -> str:
    run = f"exec {shlex.quote(python)} {module}\"$@\"" if module else f"exec {shlex.quote(python)} \"$@\""
    return ("#!/bin/sh\n# Orchard SWE task: the tests' interpreter, with the repository importable.\n"
            f"export PYTHONPATH=\"{python_path}${{PYTHONPATH:+:$PYTHONPATH}}\"\n"
            + "".join(f"export {k}={v}\n" for k, v in PYTEST_ENV.items()) + run + "\n")


async def _choose_python(sandbox: Any, candidates: list[str]) -> str:
    """The first of ``candidates`` that has pytest installed (found, not imported: importing it took a tenth of a
    core-second a workspace)."""
    find = "import importlib.util, sys; print(sys.executable) if importlib.util.find_spec('pytest') else sys.exit(1)"
    probe = "; ".join(f"{shlex.quote(c)} -c {shlex.quote(find)} 2>/dev/null && exit 0" for c in candidates)
    result = await sandbox.exec(f"{probe}; exit 1", timeout=120)
    lines = result.stdout.strip().splitlines()
    if result.exit_code != 0 or not lines:
        raise SetupError(f"no Python with pytest in the sandbox (tried {', '.join(candidates)})")
    return lines[-1]


async def setup_workspace(sandbox: Any, instance: SWEInstance, repo_dir: str = REPO_DIR, python: str | None = None,
                 shims: bool = True) -> Workspace:
    """Upload, commit and make runnable ``instance``'s repository in ``sandbox`` (an ``AsyncSandbox``).

    ``python`` forces the interpreter (a path or command inside the sandbox that can import
    pytest); ``shims=False`` writes no shims.
    """
    if not instance.repo_path:
        raise SetupError(f"instance {instance.instance_id!r} has no repo_path (the snapshot to upload)")
    with tempfile.TemporaryDirectory(prefix="orchard-swe-") as scratch:
        local = snapshot_dir(instance.repo_path, scratch)
        has_src = os.path.isdir(os.path.join(local, "src")) and not os.path.exists(os.path.join(local, "__init__.py"))
        fresh = await sandbox.exec(f"rm -rf {shlex.quote(repo_dir)} && mkdir -p {shlex.quote(repo_dir)}", timeout=120)
        if not fresh.ok:
            raise SetupError(f"could not make {repo_dir} in the sandbox: {fresh.stderr[-2000:]}")
        await sandbox.upload_dir(local, repo_dir)
    git = (f"if [ ! -d .git ]; then git init -q && git add -A && git commit -q --no-verify -m {BASE_TAG}; fi"
           f" && printf {shlex.quote(_IGNORED)} >> .git/info/exclude && git tag -f {BASE_TAG} >/dev/null")
    result = await sandbox.exec(git, cwd=repo_dir, env=_GIT_IDENTITY, timeout=300)
    if not result.ok:
        raise SetupError(f"could not commit the repository snapshot in the sandbox: {result.stderr[-2000:]}")
    chosen = await _choose_python(sandbox, [python] if python else ["python3", "python", sys.executable])
    python_path = _python_path(repo_dir, has_src)
    env = {"PYTHONPATH": python_path, **PYTEST_ENV}
    shimmed = False
    if shims:
        script = " && ".join(
            f"printf %s {shlex.quote(_shim(chosen, python_path, module))} > {path} && chmod 755 {path}"
            for path, module in ((f"{SHIM_DIR}/python", ""), (f"{SHIM_DIR}/python3", ""),
                                 (f"{SHIM_DIR}/pytest", "-m pytest ")))
        shimmed = (await sandbox.exec(f"mkdir -p {SHIM_DIR} && {script}", timeout=60)).ok
    workspace = Workspace(repo_dir=repo_dir, python=chosen, env=env, shims=shimmed)
    await sandbox.write_file(f"{repo_dir}/{STATE_FILE}", json.dumps(asdict(workspace)))
    return workspace


async def load_workspace(sandbox: Any, repo_dir: str = REPO_DIR) -> Workspace:
    """The :class:`Workspace` that :func:`setup_workspace` saved in this sandbox; :class:`SetupError` if none."""
    try:
        return Workspace(**json.loads(await sandbox.read_file(f"{repo_dir}/{STATE_FILE}")))
    except (PathNotFound, ValueError, TypeError) as exc:  # no file, bad JSON, wrong keys: not set up here
        raise SetupError(f"no task repository set up at {repo_dir} in this sandbox: run setup first ({exc})") from None


async def submission_patch(sandbox: Any, repo_dir: str = REPO_DIR) -> str:
    """The agent's change: every edit, new file and deletion since the base, as a git diff."""
    result = await sandbox.exec(f"git add -A && git diff --cached --binary {BASE_TAG}", cwd=repo_dir,
                                env=_GIT_IDENTITY, timeout=120, max_output_bytes=64 << 20)
    if not result.ok or result.truncated:
        raise SetupError(f"could not diff the repository against {BASE_TAG}: {result.stderr[-2000:]}")
    return result.stdout


async def reset_workspace(sandbox: Any, repo_dir: str = REPO_DIR) -> None:
    """Put the repository back to its base: undo edits, delete new files (setup's state file is kept)."""
    result = await sandbox.exec(f"git reset -q --hard {BASE_TAG} && git clean -qfdx", cwd=repo_dir, timeout=120)
    if not result.ok:
        raise SetupError(f"could not reset the repository to {BASE_TAG}: {result.stderr[-2000:]}")
