"""``str_replace_editor``: the file editor of OpenHands' CodeAct agent (and Anthropic's text editor
tool), on the sandbox file API.

Commands and their semantics, as OpenHands implements them:

- ``view``: a file as ``cat -n`` prints it (``view_range=[start, end]``, 1-based, ``end`` -1 for
  the last line), or a directory's non-hidden entries two levels deep.
- ``create``: write ``file_text`` to a new file (parents are created); refuses an existing path.
- ``str_replace``: replace ``old_str``, which must occur exactly once, by ``new_str`` (default
  empty); zero or several occurrences change nothing and say so (with the lines of each).
- ``insert``: insert ``new_str`` after line ``insert_line`` (0: at the top).

Edits answer with a numbered snippet around the change. Lines are the file's text split on
``\\n``, as in the reference, so a file ending in a newline shows an empty last line. One
departure: tabs are kept as they are (the reference expands them, which rewrites every tab of a
Makefile). ``undo_edit`` is not offered. Every problem is a :class:`ToolError`, whose text the
model sees; files are read and written whole through the sandbox file API (a write keeps the file's
mode), and directories are listed with ``find -H`` (a link to a directory is listed) in the sandbox.
"""

from __future__ import annotations

from typing import Literal

from orchard.env.client import (
    AsyncSandbox,
    InvalidRequest,
    IsADirectory,
    NoSpace,
    NotADirectory,
    PathNotFound,
    PathOutsideSandbox,
    PermissionDenied,
)

Command = Literal["view", "create", "str_replace", "insert"]
COMMANDS = ("view", "create", "str_replace", "insert")
SNIPPET_LINES = 4
MAX_RESPONSE_CHARS = 16_000
CLIPPED = ("<response clipped><NOTE>Only part of this output was shown, to save context. Search the file with "
           "`grep -n` and view the lines you need with `view_range`.</NOTE>")


class ToolError(Exception):
    """A command the editor refused or could not carry out; the text is shown to the model."""


def numbered(text: str, descriptor: str, first_line: int = 1) -> str:
    """``text`` as ``cat -n`` shows it, under a header naming ``descriptor``."""
    lines = "\n".join(f"{number:6}\t{line}" for number, line in enumerate(text.split("\n"), start=first_line))
    return _clip(f"Here's the result of running `cat -n` on {descriptor}:\n{lines}\n")


def _clip(text: str) -> str:
    return text if len(text) <= MAX_RESPONSE_CHARS else text[:MAX_RESPONSE_CHARS] + CLIPPED


async def str_replace_editor(sandbox: AsyncSandbox, command: str, path: str, *, file_text: str | None = None,
                             old_str: str | None = None, new_str: str | None = None, insert_line: int | None = None,
                             view_range: list[int] | None = None) -> str:
    """Run one editor command in ``sandbox``; returns what the model is shown, raises :class:`ToolError`."""
    if command not in COMMANDS:
        raise ToolError(f"Unrecognized command {command!r}. The allowed commands are: {', '.join(COMMANDS)}.")
    if not path.startswith("/"):
        raise ToolError(f"The path {path} is not an absolute path, it should start with `/`.")
    kind = await _kind(sandbox, path)
    if command == "create":
        if kind is not None:
            raise ToolError(f"File already exists at: {path}. Cannot overwrite files using command `create`.")
        if file_text is None:
            raise ToolError("Parameter `file_text` is required for command: create.")
        await _call(sandbox.write_file(path, file_text.encode()), path)
        return f"File created successfully at: {path}"
    if kind is None:
        raise ToolError(f"The path {path} does not exist. Please provide a valid path.")
    if kind == "dir":
        if command != "view":
            raise ToolError(f"The path {path} is a directory and only the `view` command can be used on directories.")
        if view_range is not None:
            raise ToolError("The `view_range` parameter is not allowed when `path` points to a directory.")
        return await _list_dir(sandbox, path)
    content = await _read(sandbox, path)
    if command == "view":
        return _view(content, path, view_range)
    if command == "str_replace":
        return await _str_replace(sandbox, path, content, old_str, new_str)
    return await _insert(sandbox, path, content, insert_line, new_str)


async def _call(awaitable, path: str):
    """A file-API call, with the sandbox's refusals of this path turned into messages for the model
    (transport failures and a vanished sandbox still raise, and abort the run)."""
    try:
        return await awaitable
    except PathNotFound:
        raise ToolError(f"The path {path} does not exist.") from None
    except PathOutsideSandbox:
        raise ToolError(f"The path {path} is outside the sandbox.") from None
    except PermissionDenied:
        raise ToolError(f"Permission denied: {path}.") from None
    except NotADirectory:
        raise ToolError(f"A parent of {path} is not a directory.") from None
    except NoSpace:
        raise ToolError(f"No space left to write {path}.") from None
    except InvalidRequest as exc:
        raise ToolError(f"The path {path!r} is not valid: {exc.detail}") from None


async def _kind(sandbox: AsyncSandbox, path: str) -> str | None:
    """``"dir"``, ``"file"`` (links to files and other non-directories included), or ``None`` if
    nothing is there (a parent that is a file included)."""

    async def probe() -> str | None:
        try:
            info = await sandbox.stat(path.rstrip("/") or "/")
            if info.type != "symlink":
                return "dir" if info.type == "dir" else "file"
            await sandbox.read_file(path)  # the file API reports links themselves: follow this one
            return "file"
        except (PathNotFound, NotADirectory):
            return None
        except IsADirectory:
            return "dir"

    return await _call(probe(), path)


async def _read(sandbox: AsyncSandbox, path: str) -> str:
    data = await _call(sandbox.read_file(path), path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"The file {path} is not UTF-8 text; use execute_bash to inspect it.") from None


async def _list_dir(sandbox: AsyncSandbox, path: str) -> str:
    result = await sandbox.exec(["find", "-H", path, "-maxdepth", "2", "-not", "-path", "*/.*"], timeout=30)
    if result.exit_code != 0:
        raise ToolError(f"Listing {path} failed: {result.stderr.strip()[-2000:]}")
    entries = "\n".join(sorted(result.stdout.splitlines()))
    return _clip(f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n"
                 f"{entries}\n")


def _view(content: str, path: str, view_range: list[int] | None) -> str:
    if view_range is None:
        return numbered(content, path)
    lines = content.split("\n")
    count = len(lines)
    if len(view_range) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) for n in view_range):
        raise ToolError(f"Invalid `view_range`: {view_range}. It should be a list of two integers.")
    first, last = view_range
    if not 1 <= first <= count:
        raise ToolError(f"Invalid `view_range`: {view_range}. Its first element `{first}` should be within the "
                        f"range of lines of the file: [1, {count}].")
    if last > count:
        raise ToolError(f"Invalid `view_range`: {view_range}. Its second element `{last}` should be smaller than "
                        f"the number of lines in the file: `{count}`.")
    if last != -1 and last < first:
        raise ToolError(f"Invalid `view_range`: {view_range}. Its second element `{last}` should be larger or "
                        f"equal than its first `{first}`.")
    shown = lines[first - 1:] if last == -1 else lines[first - 1:last]
    return numbered("\n".join(shown), path, first)


async def _str_replace(sandbox: AsyncSandbox, path: str, content: str, old_str: str | None,
                       new_str: str | None) -> str:
    if old_str is None:
        raise ToolError("Parameter `old_str` is required for command: str_replace.")
    if old_str == "":
        raise ToolError("Parameter `old_str` must not be empty.")
    new_str = new_str or ""
    if old_str == new_str:
        raise ToolError("No replacement was performed. `new_str` and `old_str` must be different.")
    starts = _occurrences(content, old_str)
    if not starts:
        raise ToolError(f"No replacement was performed, old_str `{old_str}` did not appear verbatim in {path}.")
    if len(starts) > 1:
        lines = [content.count("\n", 0, start) + 1 for start in starts]
        raise ToolError(f"No replacement was performed. Multiple occurrences of old_str `{old_str}` in lines "
                        f"{lines}. Please ensure it is unique.")
    edited = content.replace(old_str, new_str, 1)
    await _call(sandbox.write_file(path, edited.encode()), path)
    line = content.count("\n", 0, starts[0])
    first = max(0, line - SNIPPET_LINES)
    last = line + SNIPPET_LINES + new_str.count("\n")
    snippet = "\n".join(edited.split("\n")[first:last + 1])
    return (f"The file {path} has been edited. " + numbered(snippet, f"a snippet of {path}", first + 1)
            + "Review the changes and make sure they are as expected. Edit the file again if necessary.")


def _occurrences(content: str, needle: str) -> list[int]:
    """Start offsets of the non-overlapping occurrences of ``needle`` (what ``str.count`` counts)."""
    starts, at = [], content.find(needle)
    while at >= 0:
        starts.append(at)
        at = content.find(needle, at + len(needle))
    return starts


async def _insert(sandbox: AsyncSandbox, path: str, content: str, insert_line: int | None,
                  new_str: str | None) -> str:
    if insert_line is None:
        raise ToolError("Parameter `insert_line` is required for command: insert.")
    if new_str is None:
        raise ToolError("Parameter `new_str` is required for command: insert.")
    lines = content.split("\n")
    if not 0 <= insert_line <= len(lines):
        raise ToolError(f"Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines "
                        f"of the file: [0, {len(lines)}].")
    inserted = new_str.split("\n")
    await _call(sandbox.write_file(path, "\n".join(lines[:insert_line] + inserted + lines[insert_line:]).encode()),
                path)
    first = max(0, insert_line - SNIPPET_LINES)
    snippet = "\n".join(lines[first:insert_line] + inserted + lines[insert_line:insert_line + SNIPPET_LINES])
    return (f"The file {path} has been edited. " + numbered(snippet, "a snippet of the edited file", first + 1)
            + "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, "
              "etc). Edit the file again if necessary.")
