"""PodWatcher: one LIST then WATCH of the sandbox pods, kept as an in-memory cache.

The watch runs in a thread (the official ``kubernetes`` client is synchronous) and hands every event
to the event loop, where the cache lives and waiters are woken. Readiness is read from the cache:
nothing polls the API server per sandbox.

- Each watch resumes from the last ``resourceVersion`` seen, in an event or a BOOKMARK.
- A 410 Gone (the version was compacted away) is answered by a fresh LIST, whose result replaces
  the cache: pods deleted meanwhile disappear, and their waiters are woken.
- Any other error (API server restarting, network) is retried with backoff, again from a LIST.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from orchard.env.backends.kubernetes.manifests import sandbox_id_of

log = logging.getLogger(__name__)

# Waiting reasons that do not clear up by themselves: the sandbox is reported as failed at once.
FATAL_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                           "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
                           "CrashLoopBackOff"})
GONE_SECONDS = 600.0  # how long a deleted sandbox is remembered as such
PULL_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})


@dataclass(frozen=True)
class PodState:
    name: str
    phase: str
    ip: str | None
    ready: bool
    failure: str | None  # why it can never become ready, if it cannot
    reason: str | None  # the kubelet's reason for that failure (ErrImagePull...)
    waiting: str | None  # what it is waiting for (unschedulable, pulling...), for timeout messages


def _container_problem(statuses: list[dict[str, Any]] | None, kind: str) -> tuple[str, str] | None:
    """(message, reason) of the first container that cannot run."""
    for status in statuses or []:
        state = status.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
        if waiting.get("reason") in FATAL_WAITING:
            message = f"{kind} {status.get('name')!r} ({status.get('image')}): {waiting['reason']}"
            return f"{message}: {waiting['message']}" if waiting.get("message") else message, waiting["reason"]
        if terminated and not (kind == "init container" and terminated.get("exitCode") == 0):
            message = (f"{kind} {status.get('name')!r} exited with code {terminated.get('exitCode')} "
                       f"({terminated.get('reason', 'Error')})")
            if terminated.get("message"):
                message += f": {terminated['message']}"
            return message, terminated.get("reason", "Error")
    return None


def pod_state(pod: dict[str, Any]) -> PodState:
    """The cache entry of a pod, from its JSON as the API server sends it."""
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conditions.get("Ready", {}).get("status") == "True"
    problem = (_container_problem(status.get("initContainerStatuses"), "init container")
               or _container_problem(status.get("containerStatuses"), "container"))
    if problem is None and phase in ("Failed", "Succeeded"):
        problem = f"pod {phase.lower()}: {status.get('reason', '')} {status.get('message', '')}".strip(), phase
    failure, reason = problem if problem else (None, None)
    scheduled = conditions.get("PodScheduled", {})
    waiting = None
    if scheduled.get("status") == "False":
        waiting = f"{scheduled.get('reason', 'unscheduled')}: {scheduled.get('message', '')}"
    else:
        for container in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
            reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
            if reason:
                waiting = f"{container.get('name')}: {reason}"
    return PodState(name=pod["metadata"]["name"], phase=phase, ip=status.get("podIP"), ready=ready,
                    failure=failure, reason=reason, waiting=waiting)


class PodWatcher:
    """Sandbox pods by sandbox id, as of the latest event."""

    def __init__(self, core: client.CoreV1Api, namespace: str, selector: str, watch_timeout: int = 240) -> None:
        self.core = core
        self.namespace = namespace
        self.selector = selector
        self.watch_timeout = watch_timeout
        self.pods: dict[str, PodState] = {}
        self.gone: OrderedDict[str, float] = OrderedDict()  # sandbox ids deleted lately, oldest first
        self.synced = asyncio.Event()  # set after the first LIST
        self.relists = 0  # LISTs after the first (after a 410 Gone or an error)
        self.bookmarks = 0
        self._changed: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None

    # ------------------------------------------------------------------ loop side

    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="orchard-pod-watcher", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        current = self._watch
        if current is not None:
            current.stop()
            response = getattr(current, "_resp", None)
            if response is not None:
                response.close()  # unblocks the thread's read
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)

    async def wait_for(self, sandbox_id: str, done: Callable[[PodState | None], bool], timeout: float) -> PodState | None:
        """Wait until ``done(state)`` holds for the sandbox's pod (None: no such pod) and return it.
        Raises TimeoutError."""
        await self.synced.wait()
        async with asyncio.timeout(timeout):
            while True:
                changed = self._changed.setdefault(sandbox_id, asyncio.Event())
                state = self.pods.get(sandbox_id)
                if done(state):
                    return state
                await changed.wait()

    def mark_gone(self, sandbox_id: str) -> None:
        """Remember that a sandbox's pod was deleted (by an event, or by us), so that a waiter that
        never saw it can tell "gone" from "not there yet"."""
        self.gone[sandbox_id] = time.monotonic()
        self.gone.move_to_end(sandbox_id)
        while self.gone and next(iter(self.gone.values())) < time.monotonic() - GONE_SECONDS:
            self.gone.popitem(last=False)
        self._notify(sandbox_id)

    def _notify(self, sandbox_id: str) -> None:
        event = self._changed.pop(sandbox_id, None)
        if event is not None:
            event.set()

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        sandbox_id = sandbox_id_of(pod.get("metadata", {}).get("labels"))
        if sandbox_id is None:
            return
        if kind == "DELETED":
            self.pods.pop(sandbox_id, None)
            self.mark_gone(sandbox_id)
        else:
            self.pods[sandbox_id] = pod_state(pod)
        self._notify(sandbox_id)

    def _replace(self, pods: list[dict[str, Any]]) -> None:
        before = set(self.pods)
        self.pods = {}
        for pod in pods:
            self._apply("ADDED", pod)
        for sandbox_id in before - set(self.pods):
            self.mark_gone(sandbox_id)
        self.synced.set()

    # ---------------------------------------------------------------- thread side

    def _call(self, function: Callable, *args: Any) -> None:
        assert self._loop is not None
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(function, *args)

    def _list(self) -> str:
        response = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector, _preload_content=False)
        body = _json(response)
        self._call(self._replace, body.get("items") or [])
        return body["metadata"]["resourceVersion"]

    def _run(self) -> None:
        delay = 0.2
        first = True
        while not self._stop.is_set():
            try:
                if not first:
                    self.relists += 1
                first = False
                version = self._list()
                delay = 0.2
                while not self._stop.is_set():
                    version = self._watch_from(version)
            except ApiException as error:
                if error.status == 410:
                    log.info("pod watch expired (410 Gone): listing again")
                    continue
                log.warning("pod watch failed (%s %s); retrying in %.1fs", error.status, error.reason, delay)
            except Exception as error:  # the API server went away, the connection broke...
                if self._stop.is_set():
                    return
                log.warning("pod watch failed (%s); retrying in %.1fs", error, delay)
            self._stop.wait(delay)
            delay = min(delay * 2, 10.0)

    def _watch_from(self, version: str) -> str:
        """One watch request; returns the version to resume from when the server ends it."""
        self._watch = watch.Watch()
        try:
            for event in self._watch.stream(self.core.list_namespaced_pod, self.namespace, label_selector=self.selector,
                                            resource_version=version, allow_watch_bookmarks=True,
                                            timeout_seconds=self.watch_timeout):
                raw = event["raw_object"]
                version = raw.get("metadata", {}).get("resourceVersion", version)
                if event["type"] == "BOOKMARK":
                    self.bookmarks += 1
                    continue
                self._call(self._apply, event["type"], raw)
        finally:
            self._watch = None
        return version


def _json(response: Any) -> dict[str, Any]:
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()
