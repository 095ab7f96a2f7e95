"""SWE task instances in SWE-bench's format, with where Orchard finds the repository.

A :class:`SWEInstance` has SWE-bench's fields (``instance_id, repo, base_commit,
problem_statement, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS``, and the optional
``hints_text, created_at, version, environment_setup_commit``) plus Orchard's own:

* ``repo_path``: the repository snapshot at ``base_commit``, as a local directory or a tarball
  (``.tar``, ``.tar.gz``, ``.tgz``). SWE-bench itself clones ``repo`` and checks out
  ``base_commit`` inside a prebuilt image; Orchard's sandboxes have no network by default, so the
  snapshot travels with the task. A relative path is resolved against the file it was loaded from,
  so a task set directory can be moved as a whole.
* ``test_cmd``: the pytest command run in the repository (default ``{python} -m pytest``, where
  ``{python}`` is the interpreter :func:`orchard.tasks.swe.grading.setup` chose).
* ``metadata``: free-form facts about the task, e.g. where a synthetic bug was put.

SWE-bench files store the two test lists as JSON-encoded strings (``"[\\"tests/a.py::t\\"]"``);
both that and plain lists are accepted, and lists are what is written back. Unknown keys are kept
in ``extra`` and written back unchanged, so a SWE-bench file round-trips.

:func:`load_instances` reads a JSON list or JSONL. Bad input raises :class:`InstanceError`, whose
message names the file, the line (JSONL) or item (JSON list), the instance and the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

DEFAULT_TEST_CMD = "{python} -m pytest"
_REQUIRED_TEXT = ("instance_id", "repo", "base_commit", "problem_statement")
_OPTIONAL_TEXT = ("patch", "test_patch", "hints_text", "created_at", "version", "environment_setup_commit")
_TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")


class InstanceError(ValueError):
    """A task instance (or the file holding it) is malformed; the message says where and why."""


@dataclass(frozen=True)
class SWEInstance:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str = ""  # the gold patch (SWE-bench: the fix, without the tests)
    test_patch: str = ""  # applied before grading: adds or updates the tests that check the fix
    FAIL_TO_PASS: tuple[str, ...] = ()  # pytest node ids that fail before the fix and pass after it
    PASS_TO_PASS: tuple[str, ...] = ()  # node ids that pass both before and after
    hints_text: str = ""
    created_at: str = ""
    version: str = ""
    environment_setup_commit: str = ""
    # Orchard's fields
    repo_path: str | None = None
    test_cmd: str = DEFAULT_TEST_CMD
    metadata: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def test_files(self) -> list[str]:
        """The files holding the FAIL_TO_PASS and PASS_TO_PASS tests, in first-seen order."""
        seen: dict[str, None] = {}
        for test in (*self.FAIL_TO_PASS, *self.PASS_TO_PASS):
            seen.setdefault(test.split("::", 1)[0], None)
        return list(seen)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any], base_dir: str | None = None) -> SWEInstance:
        """Validate one record. ``base_dir`` resolves a relative ``repo_path``.

        Raises :class:`InstanceError` naming the instance and the field.
        """
        if not isinstance(record, Mapping):
            raise InstanceError(f"expected a JSON object, got {type(record).__name__}")
        name = record.get("instance_id")
        where = f"instance {name!r}" if isinstance(name, str) and name else "instance"

        def bad(key: str, why: str) -> InstanceError:
            return InstanceError(f"{where}: field {key!r}: {why}")

        values: dict[str, Any] = {}
        for key in _REQUIRED_TEXT:
            if key not in record:
                raise bad(key, "missing")
            if not isinstance(record[key], str) or not record[key]:
                raise bad(key, f"expected a non-empty string, got {record[key]!r:.80}")
            values[key] = record[key]
        for key in _OPTIONAL_TEXT:
            value = record.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise bad(key, f"expected a string, got {type(value).__name__}")
            values[key] = value
        for key in _TEST_LISTS:
            values[key] = _test_list(record.get(key, []), lambda why, key=key: bad(key, why))
        repo_path = record.get("repo_path")
        if repo_path is not None:
            if not isinstance(repo_path, str) or not repo_path:
                raise bad("repo_path", f"expected a path, got {repo_path!r:.80}")
            if base_dir is not None and not os.path.isabs(repo_path):
                repo_path = os.path.normpath(os.path.join(base_dir, repo_path))
            values["repo_path"] = repo_path
        test_cmd = record.get("test_cmd", DEFAULT_TEST_CMD)
        if not isinstance(test_cmd, str) or not test_cmd.strip():
            raise bad("test_cmd", f"expected a shell command, got {test_cmd!r:.80}")
        values["test_cmd"] = test_cmd
        metadata = record.get("metadata", {})
        if not isinstance(metadata, Mapping):
            raise bad("metadata", f"expected an object, got {type(metadata).__name__}")
        values["metadata"] = dict(metadata)
        known = {f.name for f in fields(cls)}
        values["extra"] = {k: v for k, v in record.items() if k not in known}
        return cls(**values)

    def to_dict(self, base_dir: str | None = None) -> dict[str, Any]:
        """A JSON-ready record; ``repo_path`` is made relative to ``base_dir`` when given."""
        record: dict[str, Any] = dict(self.extra)
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if f.name in _TEST_LISTS:
                value = list(value)
            elif f.name == "metadata":
                value = dict(value)
            elif f.name == "repo_path" and value is not None and base_dir is not None:
                value = os.path.relpath(value, base_dir)
            record[f.name] = value
        return record


def _test_list(value: Any, bad) -> tuple[str, ...]:
    """A list of node ids, given as a list or as SWE-bench's JSON-encoded string of one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise bad(f"a string must hold a JSON list of test ids ({exc.msg} at char {exc.pos})") from None
    if not isinstance(value, list | tuple):
        raise bad(f"expected a list of test ids, got {type(value).__name__}")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise bad(f"item {index} must be a non-empty string, got {item!r:.80}")
    return tuple(value)


def load_instances(path: str | os.PathLike) -> list[SWEInstance]:
    """Instances from a JSON file holding a list, or a JSONL file with one object per line.

    The format is told by the first non-blank character (``[`` means a JSON list), not the file
    name. Blank JSONL lines are skipped. Duplicate ``instance_id``\\ s are an error.
    """
    path = os.fspath(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    records: list[tuple[str, Any]] = []
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InstanceError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
        records = [(f"{path}: item {index}", item) for index, item in enumerate(items)]
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                hint = " (a JSON file must hold a list of instances)" if number == 1 else ""
                raise InstanceError(f"{path}:{number}: invalid JSON: {exc.msg} (column {exc.colno}){hint}") from None
    instances: list[SWEInstance] = []
    seen: dict[str, str] = {}
    for where, record in records:
        try:
            instance = SWEInstance.from_dict(record, base_dir=base_dir)
        except InstanceError as exc:
            raise InstanceError(f"{where}: {exc}") from None
        if instance.instance_id in seen:
            first = seen[instance.instance_id]
            raise InstanceError(f"{where}: duplicate instance_id {instance.instance_id!r} (first at {first})")
        seen[instance.instance_id] = where
        instances.append(instance)
    return instances


def save_instances(instances: Iterable[SWEInstance], path: str | os.PathLike) -> None:
    """Write JSONL, with ``repo_path`` relative to the file's directory (written whole, then renamed)."""
    path = os.fspath(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        for instance in instances:
            handle.write(json.dumps(instance.to_dict(base_dir=base_dir), ensure_ascii=False) + "\n")
    os.replace(temporary, path)
