"""Applying unified diffs: ``git apply`` first, then ``patch`` with fuzz, all or nothing.

``git apply`` is exact and understands renames and modes. Model-written diffs often have stale
line numbers or context, so when it refuses, ``patch --fuzz`` gets a dry run; only if every hunk
applies is the patch applied for real. Otherwise nothing changes and the response lists each
rejected hunk with its file, its ``@@`` header and its text.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field

from orchard.env.agent.execution import CappedBuffer, run
from orchard.env.api import PatchResponse, RejectedHunk

_FAILED = re.compile(r"^Hunk #(\d+) FAILED")
_FILE = re.compile(r"^(?:checking|patching) file '?(.+?)'?$")
_MISSING = re.compile(r"can't find file to patch|No file to patch")


@dataclass
class FileDiff:
    path: str
    hunks: list[tuple[str, str]] = field(default_factory=list)  # (header, text)


def _strip(name: str, level: int) -> str:
    name = name.split("\t")[0].strip()
    return name.split("/", level)[-1] if level and "/" in name else name


def parse_diff(diff: str) -> tuple[list[FileDiff], int]:
    """Split a unified diff into files and hunks; also guess the ``-p`` strip level."""
    lines = diff.splitlines(keepends=True)
    level = 1 if any(line.startswith(("--- a/", "+++ b/")) for line in lines) else 0
    files: list[FileDiff] = []
    old_name = ""
    for i, line in enumerate(lines):
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old_name = line[4:]
        elif line.startswith("+++ ") and old_name:
            new_name = line[4:].split("\t")[0].strip()
            name = old_name if new_name == "/dev/null" else line[4:]
            files.append(FileDiff(_strip(name, level)))
            old_name = ""
        elif line.startswith("@@") and files:
            files[-1].hunks.append((line.rstrip("\n"), line))
        elif files and files[-1].hunks and line[:1] in (" ", "+", "-", "\\"):
            header, text = files[-1].hunks[-1]
            files[-1].hunks[-1] = (header, text + line)
    return files, level


async def _tool(argv: list[str], cwd: str) -> tuple[int | None, str]:
    out = CappedBuffer(1 << 20)
    outcome = await run(argv, cwd=cwd, env=dict(os.environ, LC_ALL="C"), stdin=None, timeout=60,
                        stdout_sink=out.write, stderr_sink=out.write)
    return outcome.exit_code, out.getvalue().decode(errors="replace")


def _rejected(files: list[FileDiff], report: str) -> list[RejectedHunk]:
    by_path = {f.path: f for f in files}
    rejected: list[RejectedHunk] = []
    current: FileDiff | None = None
    for line in report.splitlines():
        if match := _FILE.match(line):
            current = by_path.get(match.group(1))
        elif (match := _FAILED.match(line)) and current is not None:
            index = int(match.group(1)) - 1
            if 0 <= index < len(current.hunks):
                header, text = current.hunks[index]
                rejected.append(RejectedHunk(file=current.path, header=header, text=text))
        elif _MISSING.search(line) and current is not None:
            rejected.extend(RejectedHunk(file=current.path, header=h, text=t) for h, t in current.hunks)
    if not rejected:  # the tool failed without naming hunks: report every hunk
        rejected = [RejectedHunk(file=f.path, header=h, text=t) for f in files for h, t in f.hunks]
    return rejected


async def apply_patch(diff: str, cwd: str, fuzz: int) -> PatchResponse:
    files, level = parse_diff(diff)
    paths = [f.path for f in files]
    if not diff.endswith("\n"):
        diff += "\n"
    fd, diff_path = tempfile.mkstemp(prefix="orchard-", suffix=".diff")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(diff)
        code, git_out = await _tool(["git", "apply", "--whitespace=nowarn", f"-p{level}", diff_path], cwd)
        if code == 0:
            return PatchResponse(applied=True, method="git", files=paths, rejected=[], output=git_out)
        base = ["patch", f"-p{level}", "--forward", "--batch", f"--fuzz={fuzz}", "-i", diff_path]
        code, dry_out = await _tool([*base, "--dry-run"], cwd)
        if code == 0:
            code, out = await _tool([*base, "--no-backup-if-mismatch", "--reject-file=-"], cwd)
            if code == 0:
                return PatchResponse(applied=True, method="patch", files=paths, rejected=[], output=out)
            dry_out = out
        return PatchResponse(applied=False, method=None, files=paths, rejected=_rejected(files, dry_out),
                             output=f"git apply:\n{git_out}\npatch:\n{dry_out}")
    finally:
        os.unlink(diff_path)
