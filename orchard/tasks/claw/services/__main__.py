"""Run the services: ``python -m claw_services --port PORT --config PATH --admin-token-file PATH``.

The admin token file is read once and deleted, so that a policy with a shell cannot read it afterwards.
"""

import argparse
import json
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m claw_services",
                                     description="Run the Orchard-Claw tool services.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--config", required=True, help="the services config (JSON)")
    parser.add_argument("--admin-token-file", required=True, help="read at start, then deleted")
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (default: %(default)s)")
    return parser.parse_args(argv)


def read_token(path: str) -> str:
    """The admin token in ``path``, which is then deleted."""
    with open(path) as f:
        token = f.read().strip()
    os.remove(path)
    return token


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        # The token first: its file must go even when the config turns out to be bad.
        token = read_token(args.admin_token_file)
        with open(args.config) as f:
            config = json.load(f)
    except (OSError, ValueError) as error:
        sys.exit(f"claw_services: {error}")

    # Imported only now: FastAPI and uvicorn are most of the start-up time.
    import uvicorn

    from .app import create_app

    try:
        app = create_app(config, token)
    except ValueError as error:
        sys.exit(f"claw_services: {error}")
    uvicorn.run(app, host=args.host, port=args.port, workers=1, log_level="warning", access_log=False,
                lifespan="off", ws="none")


if __name__ == "__main__":
    main()
