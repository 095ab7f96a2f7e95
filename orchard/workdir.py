"""Workdirs that say what made them: a record per stage, checked before a stage's output is reused.

A stage (tasks, teacher collection, SFT, RL, an evaluation) owns a folder of the workdir. When it
starts, :meth:`Stage.open` writes ``stage.json`` (the stage's name, its typed config, the
fingerprints of its inputs, and its own fingerprint, a hash of all three) and the config alone as
``config.json``; when it ends, :meth:`Stage.finish` marks the record done, with a small summary.
A later run opening the same folder finds one of:

* no record and no folder: the stage runs (``"new"``);
* a record with the same fingerprint: the stage is ``"done"`` (reuse its output) or was killed
  mid-way (``"resume"``: the trainers continue from their checkpoints);
* a record with another fingerprint, or a folder without a record: :class:`StaleStage`, whose
  message names the fields that changed, unless ``rerun=True``, which deletes the folder and runs
  the stage again (``"new"``). A stage's fingerprint is an input of the stages after it, so
  rerunning one makes the later ones stale too: with ``rerun`` they rerun, without it the run
  stops at the first of them.

Output is never reused silently when the config or the inputs that made it changed.

Two runs over one workdir (two notebooks sharing their stages, a job started twice) take turns: a process
holds a stage's lock (``.<folder>.lock`` beside it, an ``flock``) from :meth:`Stage.open` until :meth:`Stage.finish`
or its exit, so a second process waits for the first to finish the stage and then reuses it, instead of
resuming a stage that is still running elsewhere.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from typing import Any, Literal

from orchard.config import changed_fields, fingerprint, to_dict

log = logging.getLogger(__name__)
RECORD = "stage.json"
CONFIG = "config.json"
StageState = Literal["new", "resume", "done"]


class StaleStage(RuntimeError):
    """A stage's folder was made by another config or other inputs than the run asks for."""


def write_json(path: str, value: Any) -> None:
    """Write ``value`` as indented JSON, whole or not at all (through a temporary file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(to_dict(value), handle, indent=2)
        handle.write("\n")
    os.replace(temporary, path)


def read_json(path: str) -> Any:
    with open(path) as handle:
        return json.load(handle)


def file_fingerprint(path: str) -> str:
    """The fingerprint of an input that no stage made (a task file given by path): its bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


_HELD: dict[str, Any] = {}  # lock path -> the open lock file, for the stages this process holds


def _lock_path(directory: str) -> str:
    parent, base = os.path.split(os.path.abspath(directory).rstrip(os.sep))
    return os.path.join(parent, f".{base}.lock")


def _acquire(directory: str, name: str) -> None:
    """Hold ``directory``'s stage lock (reentrant within the process); wait, saying so, while another holds it."""
    path = _lock_path(directory)
    if path in _HELD:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handle = open(path, "a")  # noqa: SIM115 (held until the stage finishes)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("stage %r in %s is being made by another process: waiting for it", name, directory)
        fcntl.flock(handle, fcntl.LOCK_EX)
    _HELD[path] = handle


def _release(directory: str) -> None:
    handle = _HELD.pop(_lock_path(directory), None)
    if handle is not None:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


class Stage:
    """One stage's folder and the record of what made it (see the module docstring)."""

    def __init__(self, directory: str, name: str, config: Any, inputs: Mapping[str, str] | None = None,
                 shared: bool = False) -> None:
        self.directory, self.name = directory, name
        self.shared = shared  # opened and finished by every process of a learner together (the trainers)
        self.config = to_dict(config)
        self.inputs = dict(sorted((inputs or {}).items()))
        self.fingerprint = fingerprint({"stage": name, "config": self.config, "inputs": self.inputs})
        self.state: StageState | None = None

    @property
    def record_path(self) -> str:
        return os.path.join(self.directory, RECORD)

    def record(self) -> dict[str, Any] | None:
        return read_json(self.record_path) if os.path.exists(self.record_path) else None

    def open(self, rerun: bool = False) -> StageState:
        """Check the folder against this config and inputs; ``"new"``, ``"resume"`` or ``"done"``.

        A ``shared`` stage of a learner over several processes (:mod:`orchard.distributed`), which share the
        workdir, is opened by all of them at once: the controller checks and writes the record and every
        process gets its answer (or its error)."""
        from orchard import distributed

        if not (self.shared and distributed.is_multiprocess()):
            return self._open(rerun)
        outcome = None
        if distributed.is_controller():
            try:
                outcome = ("ok", self._open(rerun))
            except StaleStage as exc:
                outcome = ("stale", str(exc))
        kind, value = distributed.broadcast(outcome)
        if kind == "stale":
            raise StaleStage(value)
        self.state = value
        return self.state

    def _open(self, rerun: bool) -> StageState:
        _acquire(self.directory, self.name)
        record = self.record()
        if record is not None and record.get("fingerprint") == self.fingerprint:
            self.state = "done" if record.get("status") == "done" else "resume"
            if self.state == "done":
                _release(self.directory)
            return self.state
        if record is not None or (os.path.isdir(self.directory) and os.listdir(self.directory)):
            problem = self._stale_reason(record)
            if not rerun:
                _release(self.directory)
                raise StaleStage(f"stage {self.name!r} in {self.directory} {problem}. Rerun with --rerun to redo "
                                 "it and the stages after it, or use another --workdir.")
            shutil.rmtree(self.directory)
        os.makedirs(self.directory, exist_ok=True)
        write_json(os.path.join(self.directory, CONFIG), self.config)
        write_json(self.record_path, {"stage": self.name, "fingerprint": self.fingerprint, "status": "running",
                                      "started": time.time(), "config": self.config, "inputs": self.inputs})
        self.state = "new"
        return self.state

    def _stale_reason(self, record: dict[str, Any] | None) -> str:
        if record is None:
            return "has output but no stage record, so what made it is unknown"
        changes = changed_fields(record.get("config", {}), self.config)
        inputs = [name for name in sorted(set(record.get("inputs", {})) | set(self.inputs))
                  if record.get("inputs", {}).get(name) != self.inputs.get(name)]
        parts = []
        if changes:
            parts.append("config changed: " + "; ".join(changes[:12]) + (" ..." if len(changes) > 12 else ""))
        if inputs:
            parts.append("inputs changed: " + ", ".join(inputs) + " (made by another config, or rerun)")
        return "was made by another run (" + ". ".join(parts or ["its record differs"]) + ")"

    def finish(self, summary: Mapping[str, Any] | None = None) -> None:
        """Mark the stage done, with ``summary`` (small JSON values) kept in its record (for a ``shared``
        stage, written by the controller once every process has finished it)."""
        from orchard import distributed

        if self.shared:
            distributed.barrier(f"stage {self.name} finished")
        if not self.shared or distributed.is_controller():
            record = self.record() or {}
            record.update({"status": "done", "finished": time.time(), "summary": to_dict(dict(summary or {}))})
            write_json(self.record_path, record)
        _release(self.directory)
        self.state = "done"

    def __del__(self) -> None:
        if self.state in ("new", "resume"):  # dropped unfinished (its run failed): let another process have it
            _release(self.directory)

    def summary(self) -> dict[str, Any]:
        """What :meth:`finish` recorded (empty before it)."""
        return (self.record() or {}).get("summary", {})


def made_by(directory: str) -> str:
    """The fingerprint recorded in a finished stage's folder: what later stages take as an input."""
    path = os.path.join(directory, RECORD)
    record = read_json(path) if os.path.exists(path) else {}
    if record.get("status") != "done":
        raise StaleStage(f"{directory} holds no finished stage")
    return record["fingerprint"]
