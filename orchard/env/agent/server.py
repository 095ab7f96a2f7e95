"""Start the agent: read the token, build the app and serve it on a Unix socket or TCP."""

from __future__ import annotations

import argparse
import json
import os
import sys

import uvicorn

from orchard.env.agent.app import AgentConfig, AgentRoutes, create_app
from orchard.env.api import TOOLS_BIN, TOOLS_DIR

TOKEN_ENV = "ORCHARD_AGENT_TOKEN"


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="orchard env agent", description=__doc__)
    listen = parser.add_mutually_exclusive_group(required=True)
    listen.add_argument("--uds", help="listen on this Unix socket")
    listen.add_argument("--port", type=int, help="listen on this TCP port")
    parser.add_argument("--host", default="0.0.0.0", help="TCP address (with --port)")
    parser.add_argument("--root", default="/", help="directory served as the sandbox's '/'")
    parser.add_argument("--workdir", default="/workspace",
                        help="default cwd of commands ('.': where the agent starts, e.g. the image's WORKDIR)")
    parser.add_argument("--state-dir", default="/tmp/.orchard-agent", help="process logs and temp files")
    parser.add_argument("--token-file", help=f"file holding the token (default: ${TOKEN_ENV})")
    parser.add_argument("--env-file", help="JSON object of extra environment variables for commands")
    parser.add_argument("--user", help="numeric UID:GID that commands run as (default: the agent's)")
    parser.add_argument("--confine", action="store_true",
                        help="set no_new_privs and load the seccomp filter on the agent first (orchard.env.agent.confine)")
    return parser


def run_agent(args: argparse.Namespace, routes: AgentRoutes | None = None) -> None:
    """Serve the agent ``args`` describe, on ``routes`` built beforehand (the zygote's), else on new ones."""
    if getattr(args, "confine", False):
        from orchard.env.agent.confine import confine

        confine()
    if args.token_file:
        with open(args.token_file) as handle:
            token = handle.read().strip()
        os.unlink(args.token_file)
    else:
        token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise SystemExit(f"the agent needs a token: pass --token-file or set ${TOKEN_ENV}")
    # Commands inherit the agent's environment, never its secrets, nor what PyInstaller's bootloader
    # (the frozen agent of ``orchard env bundle``) adds for itself.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCHARD_AGENT", "_PYI"))}
    if getattr(sys, "frozen", False):
        for name in ("LD_LIBRARY_PATH",):
            original = env.pop(f"{name}_ORIG", None)
            env.pop(name, None)
            if original:
                env[name] = original
    if args.env_file:
        with open(args.env_file) as handle:
            env.update(json.load(handle))
    if args.root == "/" and _make_tools_dir(args.user):
        env["PATH"] = f"{TOOLS_BIN}:{env.get('PATH') or os.defpath}"
    os.environ.pop(TOKEN_ENV, None)
    config = AgentConfig(token=token, root=args.root, workdir=os.path.abspath(args.workdir), state_dir=args.state_dir,
                         env=tuple(env.items()), user=args.user)
    app = create_app(config, routes)
    # The orchestrator keeps idle connections for 15 s: keep them longer here (see server/main.py). Its only
    # client is the orchestrator, never a proxy: no X-Forwarded-* handling on every request.
    listen = {"uds": args.uds} if args.uds else {"host": args.host, "port": args.port}
    uvicorn.run(app, **listen, log_level="warning", access_log=False, timeout_keep_alive=120, proxy_headers=False)


def _make_tools_dir(user: str | None) -> bool:
    """Create :data:`~orchard.env.api.TOOLS_BIN`, owned by the user commands run as; False where the root is
    read-only there (a rootless sandbox's host tree, a read-only image root without the volume)."""
    try:
        os.makedirs(TOOLS_BIN, exist_ok=True)
        if user:
            uid, _, gid = user.partition(":")
            for path in (TOOLS_DIR, TOOLS_BIN):
                os.chown(path, int(uid), int(gid))
    except (OSError, ValueError):  # a malformed user is refused with its own message when commands start
        return False
    return True


def main() -> None:
    run_agent(build_parser().parse_args())
