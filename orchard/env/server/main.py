"""``orchard env serve``: run the orchestrator."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import threading
import time

import uvicorn

from orchard.env.backends.base import Backend
from orchard.env.backends.procfs import start_time
from orchard.env.server.app import create_app
from orchard.env.store import open_store

API_KEY_ENV = "ORCHARD_API_KEY"
KEEP_ALIVE_SECONDS = 120


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="orchard env serve", description=__doc__)
    parser.add_argument("--backend", choices=["local", "kubernetes"], default="local",
                        help="local: isolated processes on this machine; kubernetes: one pod per sandbox")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"clients' bearer key (default: ${API_KEY_ENV})")
    parser.add_argument("--store", default=None, help="memory:// (default) or redis://host:port/db")
    parser.add_argument("--state-dir", default=os.path.join(tempfile.gettempdir(), "orchard-env"),
                        help="where the local backend keeps sandboxes")
    parser.add_argument("--images", default=os.environ.get("ORCHARD_IMAGES"),
                        help="directory of images sandboxes may start from: `docker save` tarballs and OCI "
                             "layouts, by file name (default: $ORCHARD_IMAGES)")
    parser.add_argument("--agent-bundle", default=os.environ.get("ORCHARD_AGENT_BUNDLE"),
                        help="the agent bundle that image sandboxes run (`orchard env bundle`; default: "
                             "$ORCHARD_AGENT_BUNDLE)")
    parser.add_argument("--k8s-config", default=os.environ.get("ORCHARD_K8S_CONFIG"),
                        help="the kubernetes backend's options, a YAML file (orchard.env.backends.kubernetes.options; "
                             "default: $ORCHARD_K8S_CONFIG, else built-in defaults)")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig for the kubernetes backend (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--hide", action="append", default=[p for p in os.environ.get("ORCHARD_SANDBOX_HIDE", "").split(":") if p],
                        metavar="PATH", help="local backend: also hide this host path from every sandbox (repeatable; "
                        "$ORCHARD_SANDBOX_HIDE, colon-separated). Only the system directories and the agent's Python are "
                        "shown by default")
    parser.add_argument("--no-seccomp", action="store_true",
                        help="local backend: start sandboxes without the seccomp filter (for kernels that refuse it)")
    parser.add_argument("--reap-interval", type=float, default=5.0, help="seconds between TTL/orphan sweeps")
    parser.add_argument("--exit-with", type=int, default=None, metavar="PID",
                        help="shut down gracefully (deleting this orchestrator's sandboxes) once process PID has exited: "
                             "what `orchard.env.local_server` passes, so a launcher killed without the chance to stop it "
                             "leaves no orchestrator behind")
    parser.add_argument("--log-level", default="info")
    return parser


def build_backend(args: argparse.Namespace) -> Backend:
    if args.backend == "kubernetes":
        from orchard.env.backends.kubernetes import KubernetesBackend, KubernetesOptions, api_client

        try:
            options = KubernetesOptions.load(args.k8s_config)
        except (OSError, ValueError) as error:
            raise SystemExit(f"--k8s-config {args.k8s_config}: {error}") from None
        return KubernetesBackend(options, api_client(args.kubeconfig))
    from orchard.env.backends.local import LocalBackend

    return LocalBackend(args.state_dir, hide=tuple(args.hide), images_dir=args.images, agent_bundle=args.agent_bundle,
                        seccomp=not args.no_seccomp)


def serve(args: argparse.Namespace) -> None:
    if not args.api_key:
        raise SystemExit(f"an API key is required: pass --api-key or set ${API_KEY_ENV}")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    app = create_app(build_backend(args), open_store(args.store), args.api_key, reap_interval=args.reap_interval)
    if args.exit_with is not None:
        watch_launcher(args.exit_with)
    # Clients keep idle connections for 30 s; the server must keep them longer, or a request sent on
    # a connection the server is closing at that moment is reset (uvicorn's default is 5 s).
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=10, timeout_keep_alive=KEEP_ALIVE_SECONDS)


def watch_launcher(pid: int, interval: float = 1.0) -> threading.Thread | None:
    """A daemon thread that sends this process SIGTERM (uvicorn's graceful shutdown: the sandboxes are deleted)
    once process ``pid`` has exited, checked every ``interval`` seconds by its start time, so a reused pid is not
    taken for it. A launcher killed by SIGKILL, or by a SIGTERM that skipped its clean-up, otherwise left its
    orchestrator running, with its sandboxes, until someone noticed."""
    if not os.path.isdir("/proc"):  # no procfs to watch it by (not Linux)
        logging.getLogger(__name__).warning("--exit-with %d: no /proc here; not watching it", pid)
        return None
    started = start_time(pid)

    def watch() -> None:
        while started is not None and start_time(pid) == started:
            time.sleep(interval)
        logging.getLogger(__name__).warning("process %d that started this orchestrator has exited: shutting down", pid)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="launcher-watch", daemon=True)
    thread.start()
    return thread
