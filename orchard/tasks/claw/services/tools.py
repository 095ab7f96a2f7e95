"""The services' tools as a model sees them: a name, a description and a JSON schema per route.

Each tool is bound to one policy-facing route (``method`` and ``path``, a template whose ``{id}`` comes
from the argument of that name). ``finish`` records the agent's final answer (``POST /answer``).
Standard library only: the CLI (``python -m claw_services.cli``) imports this module, and
:func:`install_shims` writes its command-line tools.
"""

import os
import re
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from . import SANDBOX_NAME


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, the service it belongs to, what it does, its arguments and its route."""

    name: str
    service: str
    description: str
    parameters: dict[str, Any]
    method: str
    path: str


def string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def boolean(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def strings(description: str) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string"}, "description": description}


def make_tool(name: str, method: str, path: str, description: str, required: tuple[str, ...] = (),
              **properties: dict[str, Any]) -> ToolSpec:
    """A tool whose arguments are ``properties``; ``required`` are the ones it cannot do without."""
    parameters = {"type": "object", "properties": properties, "required": list(required),
                  "additionalProperties": False}
    return ToolSpec(name, path.split("/")[1], description, parameters, method, path)


ID = {"id": string("The id of the record.")}
ISO_TIME = "ISO 8601 date-time, e.g. 2026-03-02T14:00:00."

TOOLS: list[ToolSpec] = [
    make_tool(
        "mail_list", "GET", "/mail/messages",
        "List the messages of a mail folder (newest first, without their bodies), optionally filtered.",
        folder=string("The folder: inbox (default), archive, trash, sent, or another folder."),
        unread=boolean("true: only unread messages; false: only read ones."),
        q=string("Only messages whose subject, body or sender contains this text (any case).")
    ),
    make_tool(
        "mail_read", "GET", "/mail/messages/{id}", "Read one mail message in full, body included.",
        ("id",), **ID
    ),
    make_tool(
        "mail_send", "POST", "/mail/send", "Send an email (a copy is kept in the sent folder).",
        ("to", "subject", "body"),
        to=strings("The recipients' email addresses."), subject=string("The subject line."),
        body=string("The message text."), cc=strings("Addresses to copy."),
        in_reply_to=string("The id of the message this replies to, if any.")
    ),
    make_tool(
        "mail_move", "POST", "/mail/messages/{id}/move", "Move a mail message to another folder.",
        ("id", "folder"), **ID, folder=string("The destination folder, e.g. archive.")
    ),
    make_tool(
        "mail_label", "POST", "/mail/messages/{id}/label", "Add a label to a mail message.",
        ("id", "label"), **ID, label=string("The label to add.")
    ),
    make_tool(
        "mail_mark_read", "POST", "/mail/messages/{id}/read", "Mark a mail message as read.", ("id",), **ID
    ),
    make_tool(
        "mail_delete", "DELETE", "/mail/messages/{id}", "Delete a mail message (it moves to the trash).",
        ("id",), **ID
    ),
    make_tool(
        "calendar_list", "GET", "/calendar/events",
        "List calendar events (by start time) that overlap a time window; both bounds are optional.",
        start=string(f"The window's start, {ISO_TIME}"), end=string(f"The window's end, {ISO_TIME}")
    ),
    make_tool(
        "calendar_create", "POST", "/calendar/events", "Create a calendar event.", ("title", "start", "end"),
        title=string("The event's title."), start=string(f"Start, {ISO_TIME}"),
        end=string(f"End (after the start), {ISO_TIME}"),
        attendees=strings("The attendees' email addresses."),
        location=string("Where it takes place.")
    ),
    make_tool(
        "calendar_update", "PATCH", "/calendar/events/{id}",
        "Change some fields of a calendar event; the fields left out keep their value.", ("id",), **ID,
        title=string("The new title."), start=string(f"The new start, {ISO_TIME}"),
        end=string(f"The new end, {ISO_TIME}"), attendees=strings("The new list of attendees' emails."),
        location=string("The new location.")
    ),
    make_tool(
        "calendar_delete", "DELETE", "/calendar/events/{id}", "Delete a calendar event.", ("id",), **ID
    ),
    make_tool(
        "contacts_search", "GET", "/contacts",
        "Search the contacts by name, email or team; without a query, list them all.",
        q=string("Text to look for in the name, email or team (any case).")
    ),
    make_tool(
        "contacts_get", "GET", "/contacts/{id}", "Get one contact in full (phone and notes included).",
        ("id",), **ID
    ),
    make_tool(
        "todo_list", "GET", "/todo/items", "List the todo items, optionally only the done or open ones.",
        done=boolean("true: only completed items; false: only open ones.")
    ),
    make_tool(
        "todo_create", "POST", "/todo/items", "Create a todo item.", ("title",),
        title=string("What to do."), due=string("The due date, ISO 8601 (e.g. 2026-03-05)."),
        notes=string("Notes on the item.")
    ),
    make_tool(
        "todo_complete", "POST", "/todo/items/{id}/complete", "Mark a todo item as done.", ("id",), **ID
    ),
    make_tool(
        "todo_delete", "DELETE", "/todo/items/{id}", "Delete a todo item.", ("id",), **ID
    ),
    make_tool(
        "notifications_list", "GET", "/notifications",
        "List the notifications (newest first); dismissed ones are left out unless asked for.",
        unread=boolean("true: only unread notifications; false: only read ones."),
        include_dismissed=boolean("true: include dismissed notifications.")
    ),
    make_tool(
        "notifications_read", "POST", "/notifications/{id}/read", "Mark a notification as read.",
        ("id",), **ID
    ),
    make_tool(
        "notifications_dismiss", "POST", "/notifications/{id}/dismiss", "Dismiss a notification.",
        ("id",), **ID
    ),
    make_tool(
        "documents_list", "GET", "/documents", "List the documents (ids and titles)."
    ),
    make_tool(
        "documents_read", "GET", "/documents/{id}", "Read a document's content.", ("id",), **ID
    ),
    make_tool(
        "documents_write", "PUT", "/documents/{id}", "Replace a document's content.", ("id", "content"),
        **ID, content=string("The document's new content (all of it).")
    ),
    make_tool(
        "documents_create", "POST", "/documents", "Create a document.", ("title", "content"),
        title=string("The document's title."), content=string("The document's content.")
    ),
    make_tool(
        "finish", "POST", "/answer",
        "Finish the task and give your final answer to the user (call it once, last).", ("answer",),
        answer=string("The final answer or summary for the user.")
    ),
]

_BY_NAME = {spec.name: spec for spec in TOOLS}


def tool_by_name(name: str) -> ToolSpec:
    """The tool called ``name``; KeyError listing the tools there are if none is."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no tool {name!r}; the tools are: {', '.join(_BY_NAME)}") from None


def openai_tools(names: list[str] | None = None) -> list[dict[str, Any]]:
    """The tools called ``names`` (all of them by default) in the OpenAI function-calling format."""
    specs = TOOLS if names is None else [tool_by_name(name) for name in names]
    return [
        {"type": "function",
         "function": {"name": spec.name, "description": spec.description, "parameters": spec.parameters}}
        for spec in specs
    ]


HttpCall = tuple[str, str, dict[str, Any], dict[str, Any] | None]


def request_for(tool: ToolSpec | str, arguments: dict[str, Any]) -> HttpCall:
    """``(method, path, query, body)`` of a call of ``tool`` with ``arguments``.

    ``{id}``-style placeholders in the path take their (URL-quoted) argument; GET and DELETE send the
    other arguments in the query (booleans as ``true``/``false``), other methods in a JSON body. Null
    arguments count as left out. ValueError names a missing required argument or an unknown one.
    """
    spec = tool_by_name(tool) if isinstance(tool, str) else tool
    given = {name: value for name, value in arguments.items() if value is not None}
    unknown = sorted(set(given) - set(spec.parameters["properties"]))
    if unknown:
        raise ValueError(f"{spec.name}: unknown argument(s): {', '.join(unknown)}")
    missing = [name for name in spec.parameters["required"] if name not in given]
    if missing:
        raise ValueError(f"{spec.name}: missing required argument(s): {', '.join(missing)}")

    def substitute(match: re.Match[str]) -> str:
        return quote(str(given.pop(match.group(1))), safe="")

    path = re.sub(r"\{(\w+)\}", substitute, spec.path)
    if spec.method in ("GET", "DELETE"):
        # Booleans as JSON spells them, not as Python does.
        query = {name: "true" if value is True else "false" if value is False else value
                 for name, value in given.items()}
        return spec.method, path, query, None
    return spec.method, path, {}, given


LIST_COMMAND = "claw-tools"


def install_shims(bin_dir: str, python: str, package_parent: str) -> list[str]:
    """Write one executable per tool into ``bin_dir`` (``mail_list``...), and :data:`LIST_COMMAND`, which
    lists them; their paths, in ``TOOLS`` order, the list last.

    Each runs ``python -m claw_services.cli TOOL "$@"`` with ``package_parent`` (the directory that
    holds the ``claw_services`` package) first on ``PYTHONPATH``.
    """
    os.makedirs(bin_dir, exist_ok=True)
    paths = []
    for name, description, arguments in [*((spec.name, spec.description, spec.name) for spec in TOOLS),
                                         (LIST_COMMAND, "List the tools and what each does.", "--list")]:
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(
                "#!/bin/sh\n"
                f"# {description}\n"
                f"PYTHONPATH={shlex.quote(package_parent)}${{PYTHONPATH:+:$PYTHONPATH}}\n"
                "export PYTHONPATH\n"
                f'exec {shlex.quote(python)} -m {SANDBOX_NAME}.cli {arguments} "$@"\n'
            )
        os.chmod(path, 0o755)
        paths.append(path)
    return paths
