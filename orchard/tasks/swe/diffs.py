"""Unified diffs, read and written: the SWE tasks' one parser of patches and their one writer.

:func:`parse_diff` reads a ``git diff`` (or plain unified diff) into its files and hunks;
:func:`patched_files` and :func:`parse_patch` are views of it (the paths a patch touches, for the
grader's restore of test files; the hunks with their paths, for the oracle teacher).
:func:`unified_diff` and :func:`new_file_diff` write ``git apply``-able patches (the bug generator's
gold and test patches).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
_GIT_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
DEV_NULL = "/dev/null"


@dataclass(frozen=True)
class Hunk:
    path: str  # the file the hunk changes (its new path)
    old_start: int  # 1-based, in the old file
    old: list[str]  # context and removed lines: the text as the old file has it
    new: list[str]  # context and added lines
    section: str  # the function or class git names in the hunk header, if any
    new_start: int = 0
    lines: list[str] = field(default_factory=list)  # the body as written: " ", "-" or "+" and the text

    def patch(self) -> str:
        """This hunk alone as a ``git apply``-able patch of its file."""
        header = f"@@ -{self.old_start},{len(self.old)} +{self.new_start},{len(self.new)} @@"
        header += f" {self.section}" if self.section else ""
        return f"--- a/{self.path}\n+++ b/{self.path}\n{header}\n" + "".join(f"{line}\n" for line in self.lines)


@dataclass
class FileDiff:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    hunks: list[Hunk] = field(default_factory=list)
    marked: bool = False  # its ---/+++ lines were read

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def _path(text: str) -> str | None:
    """A ``---``/``+++`` line's path, ``a/`` and ``b/`` stripped; ``None`` for ``/dev/null``."""
    path = text.split("\t", 1)[0].strip()
    if path == DEV_NULL:
        return None
    return path[2:] if path[:2] in ("a/", "b/") else path


def parse_diff(diff: str) -> list[FileDiff]:
    """The files of a unified diff, in order, with their hunks.

    Hunk bodies are read by the line counts in their ``@@`` headers, so a removed line that starts
    with ``--`` is not mistaken for a file header. A file git creates empty (a ``diff --git`` header
    with no hunks) is listed too. Text that is not a diff gives ``[]``."""
    files: list[FileDiff] = []
    current: FileDiff | None = None
    hunk: Hunk | None = None
    old_left = new_left = 0
    for line in diff.splitlines():
        if line.startswith("\\"):  # "\ No newline at end of file"
            continue
        if hunk is not None and (old_left > 0 or new_left > 0):
            tag, text = (line[:1], line[1:]) if line else (" ", "")
            if tag in (" ", "-"):
                hunk.old.append(text)
                old_left -= 1
            if tag in (" ", "+"):
                hunk.new.append(text)
                new_left -= 1
            if tag in (" ", "-", "+"):
                hunk.lines.append(tag + text)
                continue
        hunk = None
        if match := _GIT_HEADER.match(line):
            current = FileDiff(match.group(1), match.group(2))
            files.append(current)
        elif line.startswith("--- "):
            if current is None or current.marked or current.hunks:
                current = FileDiff(None, None)
                files.append(current)
            current.old_path, current.marked = _path(line[4:]), True
        elif line.startswith("+++ ") and current is not None:
            current.new_path, current.marked = _path(line[4:]), True
        elif (match := _HUNK.match(line)) and current is not None:
            hunk = Hunk(current.path, int(match.group(1)), [], [], match.group(5).strip(), int(match.group(3)))
            old_left = int(match.group(2)) if match.group(2) is not None else 1
            new_left = int(match.group(4)) if match.group(4) is not None else 1
            current.hunks.append(hunk)
        elif line.startswith("new file mode") and current is not None:
            current.old_path = None
        elif line.startswith("deleted file mode") and current is not None:
            current.new_path = None
    return files


def patched_files(diff: str) -> list[str]:
    """Repository-relative paths a diff touches (old and new names), in first-seen order."""
    paths: dict[str, None] = {}
    for file in parse_diff(diff):
        for path in (file.old_path, file.new_path):
            if path:
                paths.setdefault(path, None)
    return list(paths)


def parse_patch(diff: str) -> list[Hunk]:
    """The hunks of a diff (a gold patch), with their file paths; ``ValueError`` when there are none."""
    hunks = [hunk for file in parse_diff(diff) for hunk in file.hunks]
    if not hunks:
        raise ValueError("the patch has no hunks")
    return hunks


def _diff_lines(lines: list[str]) -> list[str]:
    """difflib output, with git's marker after a last line that has no newline."""
    out = []
    for line in lines:
        if line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return out


def unified_diff(old: str, new: str, path: str, context: int = 3) -> str:
    """A ``git apply``-able diff that turns ``old`` into ``new`` (file ``path`` relative to the root)."""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 f"a/{path}", f"b/{path}", n=context)
    body = "".join(_diff_lines(list(lines)))
    return f"diff --git a/{path} b/{path}\n{body}" if body else ""


def new_file_diff(text: str, path: str) -> str:
    """A diff that creates ``path`` with ``text``."""
    lines = text.splitlines(keepends=True)
    header = f"diff --git a/{path} b/{path}\nnew file mode 100644\n"
    if not lines:  # git creates an empty file from the header alone
        return header
    hunk = f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n"
    return header + hunk + "".join(_diff_lines(["+" + line for line in lines]))
