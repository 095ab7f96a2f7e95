"""``orchard serve --model PATH``: serve a model with the OpenAI API (see :mod:`orchard.rollout.server`);
``orchard proxy --upstream URL``: the recording proxy in front of one (see :mod:`orchard.rollout.proxy`)."""

from __future__ import annotations

import argparse
import logging
import time

from orchard.rollout.prefix_cache import DEFAULT_PREFIX_CACHE_MB

log = logging.getLogger("orchard.rollout.server")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="orchard serve", description=__doc__)
    parser.add_argument("--model", required=True, help="an HF directory (config.json, safetensors, tokenizer) "
                                                      "or a .gguf file")
    parser.add_argument("--name", default=None, help="the served model name (default: --model as given)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", default=None, help="compute dtype, e.g. float32 (default: the model's policy)")
    parser.add_argument("--max-batch-rows", type=int, default=32,
                        help="sequences decoded together across concurrent requests (0: one request at a time)")
    parser.add_argument("--chunk-steps", type=int, default=2,
                        help="decode steps between the points where requests may join or leave the batch")
    parser.add_argument("--prefix-cache-mb", type=int, default=DEFAULT_PREFIX_CACHE_MB,
                        help="memory for the keys and values of earlier prompts that new ones extend (0: none)")
    parser.add_argument("--chat-format", default=None,
                        help="the chat format (orchard.data.chat.CHAT_FORMATS; default: by the model family)")
    parser.add_argument("--allowed-local-media-path", action="append", default=[], metavar="DIR",
                        help="a directory whose files image_url parts may name (repeatable; default: none)")
    parser.add_argument("--log-level", default="info")
    return parser


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from orchard.rollout.server import ModelServer, create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {"dtype": args.dtype} if args.dtype else {}
    started = time.perf_counter()
    server = ModelServer(args.model, args.name, args.max_batch_rows, args.chunk_steps, args.chat_format,
                         args.allowed_local_media_path, args.prefix_cache_mb, **overrides)
    log.info("loaded %s in %.1f s; serving it as %r on http://%s:%d/v1", args.model,
             time.perf_counter() - started, server.name, args.host, args.port)
    uvicorn.run(create_app(server), host=args.host, port=args.port, log_level="warning", timeout_keep_alive=120)


def build_proxy_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="orchard proxy", description="the recording proxy")
    parser.add_argument("--upstream", required=True, help="the upstream's URL (orchard serve, vLLM, any endpoint)")
    parser.add_argument("--upstream-key", default="EMPTY")
    parser.add_argument("--model", default=None, help="the upstream's model name (default: its first)")
    parser.add_argument("--records", required=True, help="directory of the sessions' JSONL records")
    parser.add_argument("--admin-key", default=None, help="required on the session routes when set")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--log-level", default="info")
    return parser


def run_proxy(args: argparse.Namespace) -> None:
    import uvicorn

    from orchard.rollout.proxy import ProxyConfig, RecordingProxy, create_proxy_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    proxy = RecordingProxy(ProxyConfig(args.upstream, args.records, args.upstream_key, args.admin_key, args.model))
    log.info("recording proxy for %s on http://%s:%d (records in %s)", args.upstream, args.host, args.port,
             args.records)
    uvicorn.run(create_proxy_app(proxy), host=args.host, port=args.port, log_level="warning", timeout_keep_alive=120)
