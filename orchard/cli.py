"""The ``orchard`` command line: ``orchard env serve|agent|bundle`` and ``orchard serve`` (a model)."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="orchard")
    groups = parser.add_subparsers(dest="group", required=True)
    env = groups.add_parser("env", help="Orchard Env: sandboxes").add_subparsers(dest="command", required=True)

    from orchard.env.agent import server as agent_server
    from orchard.env.server import main as orchestrator

    orchestrator.build_parser(env.add_parser("serve", help="run the orchestrator")).set_defaults(
        run=orchestrator.serve)
    agent_server.build_parser(env.add_parser("agent", help="run the in-sandbox agent")).set_defaults(
        run=agent_server.run_agent)
    from orchard.env import bundle

    bundle.build_parser(env.add_parser("bundle", help="build the self-contained agent bundle")).set_defaults(
        run=bundle.run_bundle)
    from orchard.rollout import main as model_server

    model_server.build_parser(groups.add_parser("serve", help="serve a model with the OpenAI API")).set_defaults(
        run=model_server.serve)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
