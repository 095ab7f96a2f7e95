"""The ``orchard`` command line: ``orchard env serve|agent|bundle``, ``orchard serve`` (a model) and ``orchard proxy``.

Only the chosen command's module is imported, so ``orchard serve`` runs with the serving extra
alone (none of the sandbox server's dependencies), and ``orchard env agent`` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (group, command) -> (module, its parser builder, its entry point, help)
COMMANDS = {
    ("env", "serve"): ("orchard.env.server.main", "build_parser", "serve", "run the orchestrator"),
    ("env", "agent"): ("orchard.env.agent.server", "build_parser", "run_agent", "run the in-sandbox agent"),
    ("env", "bundle"): ("orchard.env.bundle", "build_parser", "run_bundle", "build the self-contained agent bundle"),
    ("serve",): ("orchard.rollout.main", "build_parser", "serve", "serve a model with the OpenAI API"),
    ("proxy",): ("orchard.rollout.main", "build_proxy_parser", "run_proxy", "record every call to an OpenAI API"),
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    words = tuple(a for a in argv if not a.startswith("-"))
    parser = argparse.ArgumentParser(prog="orchard")
    groups = parser.add_subparsers(dest="group", required=True)
    env = groups.add_parser("env", help="Orchard Env: sandboxes").add_subparsers(dest="command", required=True)
    for key, (module, build, run, help_text) in COMMANDS.items():
        sub = (env if key[0] == "env" else groups).add_parser(key[-1], help=help_text)
        if words[:len(key)] == key:  # the command asked for: load it, and only it
            loaded = importlib.import_module(module)
            getattr(loaded, build)(sub).set_defaults(run=getattr(loaded, run))
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
