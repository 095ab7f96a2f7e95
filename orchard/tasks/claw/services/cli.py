"""The services' tools on the command line: ``python -m claw_services.cli TOOL [--param value ...]``.

The options of each tool come from its JSON schema: strings as ``--name VALUE``, booleans as
``--name true|false``, arrays as repeated values or comma lists (``--to a@x.org b@x.org`` or
``--to a@x.org,b@x.org``); ``--json '{...}'`` gives the arguments as one object instead. The services
are at ``$CLAW_SERVICES_URL`` (default ``http://127.0.0.1:8765``). The JSON reply goes to stdout.

Exit status: 0 on success, 1 when the service answers with an error (status and body on stderr,
with ``Retry-After`` on a 429) or cannot be reached, 2 on a usage error. ``--list`` lists the tools.
:func:`~.tools.install_shims` writes one executable per tool, for harnesses that only have a shell.
Standard library only.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlencode

from .tools import TOOLS, ToolSpec, install_shims, request_for, tool_by_name

__all__ = ["install_shims", "main"]

DEFAULT_URL = "http://127.0.0.1:8765"
TIMEOUT_SECONDS = 60


def parse_bool(text: str) -> bool:
    """``true`` or ``false`` (any case; also yes/no, 1/0)."""
    lowered = text.lower()
    if lowered in ("true", "yes", "1"):
        return True
    if lowered in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def tool_parser(spec: ToolSpec) -> argparse.ArgumentParser:
    """The options of one tool, from its JSON schema (``--in_reply_to`` is also ``--in-reply-to``)."""
    parser = argparse.ArgumentParser(prog=spec.name, description=spec.description)
    required = set(spec.parameters["required"])
    for name, schema in spec.parameters["properties"].items():
        flags = sorted({f"--{name}", f"--{name.replace('_', '-')}"})
        help_text = schema["description"] + (" (required)" if name in required else "")
        if schema["type"] == "boolean":
            parser.add_argument(*flags, dest=name, type=parse_bool, metavar="true|false", help=help_text)
        elif schema["type"] == "array":
            parser.add_argument(*flags, dest=name, nargs="+", action="extend", metavar="VALUE",
                                help=help_text)
        else:
            parser.add_argument(*flags, dest=name, metavar="VALUE", help=help_text)
    parser.add_argument("--json", dest="json_arguments", metavar="OBJECT",
                        help="all arguments as one JSON object (options given as well override it)")
    return parser


def tool_arguments(spec: ToolSpec, parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """The arguments of a call from its command line; usage errors exit with status 2."""
    options = vars(parser.parse_args(argv))
    arguments: dict[str, Any] = {}
    json_arguments = options.pop("json_arguments")
    if json_arguments is not None:
        try:
            arguments = json.loads(json_arguments)
        except ValueError as error:
            parser.error(f"--json: {error}")
        if not isinstance(arguments, dict):
            parser.error("--json: expected a JSON object")
    for name, value in options.items():
        if value is None:
            continue
        if spec.parameters["properties"][name]["type"] == "array":
            value = [part.strip() for item in value for part in item.split(",") if part.strip()]
        arguments[name] = value
    return arguments


def call(base_url: str, method: str, path: str, query: dict[str, Any], body: dict | None) -> int:
    """Make one request and print its reply; the exit status (0 on 2xx, else 1)."""
    url = base_url.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
    data = None if body is None else json.dumps(body).encode()
    headers = {} if data is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    # The services are local: never go through a proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=TIMEOUT_SECONDS) as reply:
            text = reply.read().decode()
    except urllib.error.HTTPError as error:
        retry_after = error.headers.get("Retry-After")
        note = f" (Retry-After: {retry_after})" if retry_after else ""
        print(f"HTTP {error.code}{note}: {error.read().decode()}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as error:
        print(f"cannot reach the services at {base_url}: {getattr(error, 'reason', error)}", file=sys.stderr)
        return 1
    try:
        print(json.dumps(json.loads(text), indent=2, ensure_ascii=False))
    except ValueError:
        print(text)
    return 0


def list_tools() -> None:
    width = max(len(spec.name) for spec in TOOLS)
    for spec in TOOLS:
        print(f"{spec.name.ljust(width)}  {spec.description}")


def main(argv: list[str] | None = None) -> int:
    """Run one tool (or ``--list``); the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m claw_services.cli TOOL [--param value ...] | --list  (TOOL --help: its options)"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--list":
        list_tools()
        return 0
    try:
        spec = tool_by_name(argv[0])
    except KeyError as error:
        print(f"{error.args[0]}\n{usage}", file=sys.stderr)
        return 2
    parser = tool_parser(spec)
    arguments = tool_arguments(spec, parser, argv[1:])
    try:
        method, path, query, body = request_for(spec, arguments)
    except ValueError as error:
        parser.error(str(error))
    return call(os.environ.get("CLAW_SERVICES_URL", DEFAULT_URL), method, path, query, body)


if __name__ == "__main__":
    sys.exit(main())
