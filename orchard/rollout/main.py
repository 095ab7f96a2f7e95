"""``orchard serve --model PATH``: serve a model with the OpenAI API (see :mod:`orchard.rollout.server`)."""

from __future__ import annotations

import argparse
import logging
import time

log = logging.getLogger("orchard.rollout.server")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="orchard serve", description=__doc__)
    parser.add_argument("--model", required=True, help="an HF directory (config.json, safetensors, tokenizer) "
                                                      "or a .gguf file")
    parser.add_argument("--name", default=None, help="the served model name (default: --model as given)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", default=None, help="compute dtype, e.g. float32 (default: the model's policy)")
    parser.add_argument("--log-level", default="info")
    return parser


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from orchard.rollout.server import ModelServer, create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {"dtype": args.dtype} if args.dtype else {}
    started = time.perf_counter()
    server = ModelServer(args.model, args.name, **overrides)
    log.info("loaded %s in %.1f s; serving it as %r on http://%s:%d/v1", args.model,
             time.perf_counter() - started, server.name, args.host, args.port)
    uvicorn.run(create_app(server), host=args.host, port=args.port, log_level="warning", timeout_keep_alive=120)
