"""``python -m orchard.env.agent``: the agent's entry point inside a sandbox."""

from orchard.env.agent.server import main

main()
