"""The Kubernetes backend: one pod per sandbox, created from the task's own image.

- Cold path (create, delete, readiness) through the API server, with the official ``kubernetes``
  client (synchronous, so its calls run in threads).
- Hot path (exec, files): the orchestrator talks to ``http://<pod IP>:<agent port>`` directly, never
  through ``kubectl exec``.
- Readiness comes from the :class:`PodWatcher`'s cache (the pod's Ready condition, set by the
  readiness probe on the agent's ``/health``): no per-sandbox polling of the API server.
- A pod that can never start (an image that cannot be pulled, a container that exits) fails its
  create at once with the kubelet's reason; one that cannot be scheduled fails at ``ready_timeout``
  with the scheduler's message.

Snapshots and fork are local-backend features for now (501 ``unsupported`` here).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from orchard.env.api import ErrorCode, SandboxSpec, SnapshotInfo
from orchard.env.backends.base import BackendError, SandboxHandle
from orchard.env.backends.kubernetes.manifests import (
    agent_secret,
    network_policy,
    owned_by,
    pod_name,
    sandbox_id_of,
    sandbox_pod,
    secret_name,
)
from orchard.env.backends.kubernetes.options import KubernetesOptions
from orchard.env.backends.kubernetes.watcher import PULL_FAILURES, PodState, PodWatcher

log = logging.getLogger(__name__)

API_TIMEOUT = 30.0  # seconds for one API call
SYNC_TIMEOUT = 30.0  # seconds for the watcher's first LIST


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In a pod: its service account. Elsewhere: ``kubeconfig`` (default ``~/.kube/config``)."""
    if kubeconfig is None:
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            pass
    try:
        return config.new_client_from_config(config_file=kubeconfig)
    except (config.ConfigException, OSError) as error:
        raise SystemExit(f"the kubernetes backend cannot reach a cluster: not in a pod, and the kubeconfig "
                         f"{kubeconfig or '~/.kube/config'} cannot be used ({error}); pass --kubeconfig") from None


def _unsupported(what: str) -> BackendError:
    return BackendError(f"{what} needs the local backend (the kubernetes backend has no snapshots yet)", 501,
                        ErrorCode.UNSUPPORTED)


class KubernetesBackend:
    name = "kubernetes"
    # Pods start on other nodes: the orchestrator only waits, so many may start at once (the local
    # backend's limit is its own CPUs). Pulls and scheduling can take minutes.
    max_starting = 1024

    def __init__(self, options: KubernetesOptions, api: client.ApiClient) -> None:
        self.options = options
        self.ready_timeout = options.ready_timeout
        self.core = client.CoreV1Api(api)
        self.networking = client.NetworkingV1Api(api)
        self.watcher = PodWatcher(self.core, options.namespace, owned_by(options), options.watch_timeout)
        self._api = api

    async def _started(self) -> None:
        self.watcher.start()
        try:
            await asyncio.wait_for(self.watcher.synced.wait(), SYNC_TIMEOUT)
        except TimeoutError:
            raise BackendError(f"cannot list pods in namespace {self.options.namespace!r} through the Kubernetes "
                               f"API at {self._api.configuration.host} (see the orchestrator's log)") from None

    async def _call(self, function, *args, **kwargs):
        """One API call in a thread (its answer as JSON); an API error becomes a clear BackendError."""
        try:
            response = await asyncio.to_thread(function, *args, _request_timeout=API_TIMEOUT,
                                               _preload_content=False, **kwargs)
            return json.loads(response.data)
        except ApiException as error:
            if error.status == 422:  # e.g. an image reference the API server refuses
                raise BackendError(f"Kubernetes refused the sandbox: {_message(error)}", 400,
                                   ErrorCode.INVALID_REQUEST) from None
            raise BackendError(f"Kubernetes API: {error.status} {error.reason}: {_message(error)}") from None

    # ----------------------------------------------------------------- create

    async def create(self, sandbox_id: str, spec: SandboxSpec) -> SandboxHandle:
        if spec.from_snapshot:
            raise _unsupported("starting from a snapshot")
        await self._started()
        token = secrets.token_urlsafe(32)
        namespace = self.options.namespace
        # The Secret first (the pod refers to it), then the policy (no moment without one), then the pod.
        await self._call(self.core.create_namespaced_secret, namespace, agent_secret(sandbox_id, token, spec,
                                                                                      self.options))
        await self._call(self.networking.create_namespaced_network_policy, namespace,
                         network_policy(sandbox_id, spec, self.options))
        await self._call(self.core.create_namespaced_pod, namespace, sandbox_pod(sandbox_id, spec, self.options))
        # The agent's address is known once the pod has an IP; wait_ready records it.
        return SandboxHandle(sandbox_id, "", token, {"pod": pod_name(sandbox_id), "namespace": namespace})

    async def wait_ready(self, handle: SandboxHandle, timeout: float) -> str:
        """The agent's URL once the pod is Ready; a BackendError with the reason if it cannot be."""
        last: list[PodState | None] = [None]

        def settled(state: PodState | None) -> bool:
            last[0] = state
            if state is None:  # not seen yet, or deleted
                return handle.id in self.watcher.gone
            return state.failure is not None or (state.ready and state.ip is not None)

        try:
            state = await self.watcher.wait_for(handle.id, settled, timeout)
        except TimeoutError:
            waiting = last[0].waiting if last[0] else None
            raise BackendError(f"pod {pod_name(handle.id)} not ready after {timeout:.0f}s"
                               + (f" ({waiting})" if waiting else "")) from None
        if state is None:
            raise BackendError(f"pod {pod_name(handle.id)} was deleted while it started", 404,
                               ErrorCode.SANDBOX_NOT_FOUND)
        if state.failure is not None:
            if state.reason in PULL_FAILURES:
                raise BackendError(f"pod {pod_name(handle.id)}: the image cannot be pulled: {state.failure}", 404,
                                   ErrorCode.IMAGE_NOT_FOUND)
            raise BackendError(f"pod {pod_name(handle.id)} cannot start: {state.failure}")
        return f"http://{_host(state.ip)}:{self.options.agent_port}"

    async def failure(self, handle: SandboxHandle) -> str | None:
        await self._started()
        state = self.watcher.pods.get(handle.id)
        if state is None:
            return f"pod {pod_name(handle.id)} is gone"
        return state.failure

    async def alive(self, handle: SandboxHandle) -> bool:
        await self._started()
        state = self.watcher.pods.get(handle.id)
        return state is not None and state.failure is None

    # ------------------------------------------------------------ delete, list

    async def delete(self, handle_or_id: SandboxHandle | str) -> None:
        sandbox_id = handle_or_id.id if isinstance(handle_or_id, SandboxHandle) else handle_or_id
        namespace = self.options.namespace
        self.watcher.mark_gone(sandbox_id)
        for function, name in ((self.core.delete_namespaced_pod, pod_name(sandbox_id)),
                               (self.networking.delete_namespaced_network_policy, pod_name(sandbox_id)),
                               (self.core.delete_namespaced_secret, secret_name(sandbox_id))):
            try:
                await asyncio.to_thread(function, name, namespace, grace_period_seconds=0,
                                        _request_timeout=API_TIMEOUT, _preload_content=False)
            except ApiException as error:
                if error.status != 404:
                    raise BackendError(f"Kubernetes API: deleting {name}: {error.status} {error.reason}: "
                                       f"{_message(error)}") from None

    async def list(self) -> set[str]:
        """Sandboxes with a pod (from the watcher's cache), a Secret or a NetworkPolicy left."""
        await self._started()
        ids = set(self.watcher.pods)
        namespace = self.options.namespace
        for function in (self.core.list_namespaced_secret, self.networking.list_namespaced_network_policy):
            found = await self._call(function, namespace, label_selector=owned_by(self.options))
            ids.update(filter(None, (sandbox_id_of(item["metadata"].get("labels")) for item in found["items"])))
        return ids

    # --------------------------------------------------------------- snapshots

    async def snapshot(self, sandbox_id: str) -> SnapshotInfo:
        raise _unsupported("snapshot and fork")

    async def list_snapshots(self) -> list[SnapshotInfo]:
        return []

    async def delete_snapshot(self, snapshot_id: str) -> None:
        raise _unsupported("deleting a snapshot")

    async def close(self) -> None:
        await self.watcher.stop()
        await asyncio.to_thread(self._api.close)


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _message(error: ApiException) -> str:
    try:
        return json.loads(error.body).get("message", error.body)
    except (TypeError, ValueError):
        return str(error.body)
