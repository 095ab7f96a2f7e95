"""An in-process fake of the Kubernetes API, for testing the Kubernetes backend without a cluster.

It is a real HTTP server on loopback that the real ``kubernetes`` client talks to, so requests and
responses go through the client's own serialisation. What it covers:

- **Objects**: pods, secrets and network policies in any namespace; create (every object is first
  validated against the Kubernetes OpenAPI schema, strict, as the API server would refuse it), get,
  list with label selectors, delete; ``Status`` bodies for errors (404, 409, 422, 401).
- **Watch**: ``?watch=true`` streams from a ``resourceVersion``, with BOOKMARK events when asked;
  a version older than the kept history is answered with a 410 Gone ERROR event (``compact()``),
  and ``drop_watches()`` ends every stream as an API server restart would.
- **A kubelet**: a created pod is scheduled (or left Unschedulable), its images are "pulled" (an
  image not in ``images`` fails with ErrImagePull), the container's ``secretKeyRef`` env is resolved
  (a missing secret is CreateContainerConfigError), and the agent is started as a host process on
  its own loopback address (127.0.0.N, the pod IP) with the container's args; the readiness probe
  declared in the pod is run against it, and the process exiting fails the pod.

What it does not do is written in ``docs/kubernetes.md``: no container runtime (the agent runs on the
host, not in the image), no NetworkPolicy enforcement, no scheduler beyond one switch.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kubernetes_validate
import psutil
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from orchard.env.local import free_port
from tests.conftest import K8S_VERSION

TOKEN = "fake-cluster-token"
RESOURCES = {  # (API prefix, plural) -> kind
    ("api/v1", "pods"): "Pod",
    ("api/v1", "secrets"): "Secret",
    ("apis/networking.k8s.io/v1", "networkpolicies"): "NetworkPolicy",
}


def status(code: int, reason: str, message: str) -> JSONResponse:
    return JSONResponse({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": message, "reason": reason, "code": code}, status_code=code)


def truthy(value: str | None) -> bool:
    """A boolean query parameter, parsed as the API server (Go's strconv.ParseBool) does."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def matches(labels: dict[str, str], selector: str | None) -> bool:
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@dataclass
class Event:
    version: int
    resource: str
    namespace: str
    type: str
    object: dict[str, Any]


@dataclass
class PodRuntime:
    process: asyncio.subprocess.Process | None = None
    task: asyncio.Task | None = None
    directory: str = ""


@dataclass
class FakeKubernetes:
    workdir: str
    images: set[str] = field(default_factory=set)
    bookmark_interval: float = 0.5
    schedulable: bool = True

    def __post_init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.version = 0
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (resource, namespace, name)
        self.history: list[Event] = []
        self.compacted = 0  # versions up to this one are forgotten
        self.watches: set[asyncio.Queue] = set()
        self.runtimes: dict[str, PodRuntime] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path), for tests
        self.watch_gate: asyncio.Event | None = None  # while cleared, new watches wait (hold_watches)
        self._next_ip = 2
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeKubernetes:
        app = Starlette(routes=[
            Route("/{prefix:path}/namespaces/{namespace}/{resource}", self._collection, methods=["GET", "POST"]),
            Route("/{prefix:path}/namespaces/{namespace}/{resource}/{name}", self._item, methods=["GET", "DELETE"]),
        ])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False,
                                lifespan="off")
        self._server = uvicorn.Server(config)

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self.watch_gate = asyncio.Event()
            self.watch_gate.set()
            self._loop.run_until_complete(self._server.serve())

        self._thread = threading.Thread(target=run, name="fake-kubernetes", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the fake Kubernetes API did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.call(self._stop_pods)
        self.drop_watches()
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(10)

    async def _stop_pods(self) -> None:
        for name in list(self.runtimes):
            await self._stop_pod(name)

    def call(self, function, *args) -> Any:
        """Run ``function`` (a coroutine function or a plain one) in the server's loop, from a test."""
        async def run():
            result = function(*args)
            return await result if asyncio.iscoroutine(result) else result

        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    def kubeconfig(self, path: str, namespace: str = "orchard-sandboxes") -> str:
        with open(path, "w") as handle:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "fake",
                       "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                       "users": [{"name": "fake", "user": {"token": TOKEN}}],
                       "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                                 "namespace": namespace}}]}, handle)
        return path

    # ------------------------------------------------------------- test controls

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: older watches get 410 Gone."""
        def run() -> None:
            self.compacted = self.version
            self.history.clear()
        self.call(run)

    def drop_watches(self) -> None:
        """End every watch stream (an API server restart, a load balancer timeout)."""
        def run() -> None:
            for queue in list(self.watches):
                queue.put_nowait(None)
        self.call(run)

    def hold_watches(self, held: bool) -> None:
        """While held, a new watch request waits before it is answered (a client cut off from the API)."""
        assert self.watch_gate is not None
        self.call(self.watch_gate.clear if held else self.watch_gate.set)

    def list_objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.call(lambda: [copy.deepcopy(o) for (r, ns, _), o in self.objects.items()
                                  if r == resource and namespace in (None, ns)])

    def kill_agent(self, pod: str) -> None:
        """SIGKILL a pod's agent process: its container exits and the pod fails."""
        def run() -> None:
            runtime = self.runtimes[pod]
            assert runtime.process is not None
            runtime.process.kill()
        self.call(run)

    def delete_object(self, resource: str, namespace: str, name: str) -> None:
        self.call(self._delete, resource, namespace, name)

    def create_object(self, resource: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create an object as another client of the API would (for orphans in tests)."""
        return self.call(self._create, resource, namespace, body)

    # -------------------------------------------------------------------- HTTP

    def _authorised(self, request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {TOKEN}"

    def _resource(self, request: Request) -> str | None:
        key = (request.path_params["prefix"], request.path_params["resource"])
        return key[1] if key in RESOURCES else None

    async def _collection(self, request: Request):
        self.requests.append((request.method, request.url.path))
        if not self._authorised(request):
            return status(401, "Unauthorized", "Unauthorized")
        resource, namespace = self._resource(request), request.path_params["namespace"]
        if resource is None:
            return status(404, "NotFound", f"the server could not find the requested resource ({request.url.path})")
        if request.method == "POST":
            try:
                body = json.loads(await request.body())
            except ValueError as error:
                return status(400, "BadRequest", f"invalid JSON: {error}")
            try:
                return JSONResponse(self._create(resource, namespace, body), status_code=201)
            except LookupError as error:
                return status(409, "AlreadyExists", str(error))
            except ValueError as error:
                return status(422, "Invalid", str(error))
        selector = request.query_params.get("labelSelector")
        if truthy(request.query_params.get("watch")):
            assert self.watch_gate is not None
            await self.watch_gate.wait()
            return self._watch(resource, namespace, selector, request.query_params)
        items = [copy.deepcopy(o) for (r, ns, _), o in sorted(self.objects.items())
                 if r == resource and ns == namespace and matches(o["metadata"].get("labels") or {}, selector)]
        prefix = request.path_params["prefix"]
        return JSONResponse({"apiVersion": prefix.removeprefix("apis/").removeprefix("api/"),
                             "kind": f"{RESOURCES[(prefix, resource)]}List",
                             "metadata": {"resourceVersion": str(self.version)}, "items": items})

    async def _item(self, request: Request):
        self.requests.append((request.method, request.url.path))
        if not self._authorised(request):
            return status(401, "Unauthorized", "Unauthorized")
        resource, namespace, name = self._resource(request), request.path_params["namespace"], request.path_params["name"]
        found = self.objects.get((resource, namespace, name)) if resource else None
        if found is None:
            return status(404, "NotFound", f'{resource} "{name}" not found')
        if request.method == "GET":
            return JSONResponse(copy.deepcopy(found))
        return JSONResponse(await self._delete(resource, namespace, name))

    # ----------------------------------------------------------------- objects

    def _create(self, resource: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        metadata = body.setdefault("metadata", {})
        name = metadata.get("name")
        if not name:
            raise ValueError("metadata.name: Required value: name or generateName is required")
        if metadata.setdefault("namespace", namespace) != namespace:
            raise ValueError("the namespace of the object does not match the namespace on the request")
        try:
            kubernetes_validate.validate(body, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            raise ValueError(f"{body.get('kind')} {name!r} is invalid: {error.message} at "
                             f"{'.'.join(map(str, error.path))}") from None
        if (resource, namespace, name) in self.objects:
            raise LookupError(f'{resource} "{name}" already exists')
        stored = copy.deepcopy(body)
        stored["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ"))
        if resource == "secrets":
            data = stored.setdefault("data", {})
            for key, value in stored.pop("stringData", {}).items():
                data[key] = base64.b64encode(value.encode()).decode()
        if resource == "pods":
            stored["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
        self.objects[(resource, namespace, name)] = stored
        self._record(resource, namespace, "ADDED", stored)
        if resource == "pods":
            self.runtimes[name] = PodRuntime()
            self.runtimes[name].task = asyncio.get_running_loop().create_task(self._kubelet(namespace, name))
        return copy.deepcopy(stored)

    async def _delete(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        found = self.objects.pop((resource, namespace, name))
        self._record(resource, namespace, "DELETED", found)
        if resource == "pods":
            await self._stop_pod(name)
        return copy.deepcopy(found)

    def _record(self, resource: str, namespace: str, kind: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        event = Event(self.version, resource, namespace, kind, copy.deepcopy(obj))
        self.history.append(event)
        for queue in list(self.watches):
            queue.put_nowait(event)

    def _update_pod(self, namespace: str, name: str, **status: Any) -> dict[str, Any] | None:
        pod = self.objects.get(("pods", namespace, name))
        if pod is not None:
            pod["status"].update(status)
            self._record("pods", namespace, "MODIFIED", pod)
        return pod

    # ------------------------------------------------------------------- watch

    def _watch(self, resource: str, namespace: str, selector: str | None, params) -> StreamingResponse:
        since = params.get("resourceVersion")
        bookmarks = truthy(params.get("allowWatchBookmarks"))
        timeout = float(params.get("timeoutSeconds") or 1800)
        kind = next(k for (_, plural), k in RESOURCES.items() if plural == resource)

        def line(kind_: str, obj: dict[str, Any]) -> bytes:
            return (json.dumps({"type": kind_, "object": obj}) + "\n").encode()

        def wanted(event: Event) -> bool:
            return (event.resource == resource and event.namespace == namespace
                    and matches(event.object["metadata"].get("labels") or {}, selector))

        # Everything below up to the first await runs at once: nothing can slip between the replay
        # and the subscription.
        if since not in (None, "", "0") and int(since) < self.compacted:
            backlog = [line("ERROR", {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                      "message": f"too old resource version: {since} ({self.compacted})",
                                      "reason": "Expired", "code": 410})]
            queue = None
        else:
            if since in (None, "", "0"):  # like the API server: the current state as ADDED events
                backlog = [line("ADDED", copy.deepcopy(o)) for (r, ns, _), o in sorted(self.objects.items())
                           if r == resource and ns == namespace
                           and matches(o["metadata"].get("labels") or {}, selector)]
            else:
                backlog = [line(e.type, e.object) for e in self.history if e.version > int(since) and wanted(e)]
            queue = asyncio.Queue()
            self.watches.add(queue)

        async def stream():
            try:
                for chunk in backlog:
                    yield chunk
                if queue is None:
                    return
                deadline = time.monotonic() + timeout
                while (left := deadline - time.monotonic()) > 0:
                    try:
                        event = await asyncio.wait_for(queue.get(), min(left, self.bookmark_interval))
                    except TimeoutError:
                        if bookmarks:
                            yield line("BOOKMARK", {"kind": kind, "apiVersion": "v1",
                                                    "metadata": {"resourceVersion": str(self.version)}})
                        continue
                    if event is None:
                        return
                    if wanted(event):
                        yield line(event.type, event.object)
            finally:
                if queue is not None:
                    self.watches.discard(queue)

        return StreamingResponse(stream(), media_type="application/json")

    # ----------------------------------------------------------------- kubelet

    async def _kubelet(self, namespace: str, name: str) -> None:
        pod = self.objects[("pods", namespace, name)]
        spec = pod["spec"]
        if not self.schedulable:
            self._update_pod(namespace, name, conditions=[{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available."}])
            return
        ip = f"127.0.0.{self._next_ip}"
        self._next_ip += 1
        scheduled = {"type": "PodScheduled", "status": "True"}
        init, container = spec["initContainers"][0], spec["containers"][0]
        for item, kind in ((init, "initContainerStatuses"), (container, "containerStatuses")):
            if item["image"] not in self.images:
                waiting = {"reason": "ErrImagePull", "message": f'failed to pull and unpack image "{item["image"]}": '
                                                              f"not found"}
                self._update_pod(namespace, name, hostIP="127.0.0.1", podIP=ip, podIPs=[{"ip": ip}],
                                 conditions=[scheduled], **{kind: [{"name": item["name"], "image": item["image"],
                                                                    "ready": False, "imageID": "", "restartCount": 0,
                                                                    "state": {"waiting": waiting}}]})
                return
        init_status = [{"name": init["name"], "image": init["image"], "ready": False, "imageID": "", "restartCount": 0,
                        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]
        env = dict(os.environ)
        for variable in container.get("env", []):
            if "value" in variable:
                env[variable["name"]] = variable["value"]
                continue
            ref = variable["valueFrom"]["secretKeyRef"]
            secret = self.objects.get(("secrets", namespace, ref["name"]))
            if secret is None or ref["key"] not in secret.get("data", {}):
                waiting = {"reason": "CreateContainerConfigError", "message": f'secret "{ref["name"]}" not found'}
                self._update_pod(namespace, name, podIP=ip, conditions=[scheduled], initContainerStatuses=init_status,
                                 containerStatuses=[{"name": container["name"], "image": container["image"],
                                                     "ready": False, "imageID": "", "restartCount": 0, "state": {"waiting": waiting}}])
                return
            env[variable["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        runtime = self.runtimes[name]
        runtime.directory = os.path.join(self.workdir, "pods", name)
        os.makedirs(runtime.directory, exist_ok=True)
        with open(os.path.join(runtime.directory, "agent.log"), "wb") as log:
            runtime.process = await asyncio.create_subprocess_exec(
                *self._agent_argv(container, ip, runtime.directory), env=env, cwd=runtime.directory,
                stdout=asyncio.subprocess.DEVNULL, stderr=log, start_new_session=True)
        running = {"name": container["name"], "image": container["image"], "imageID": "", "restartCount": 0, "started": True,
                   "state": {"running": {"startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ")}}}
        self._update_pod(namespace, name, phase="Running", hostIP="127.0.0.1", podIP=ip, podIPs=[{"ip": ip}],
                         conditions=[scheduled, {"type": "Ready", "status": "False"}],
                         initContainerStatuses=init_status, containerStatuses=[{**running, "ready": False}])
        probe = asyncio.get_running_loop().create_task(self._probe(namespace, name, container, ip, running, scheduled))
        code = await runtime.process.wait()
        probe.cancel()
        if ("pods", namespace, name) in self.objects:
            self._update_pod(namespace, name, phase="Failed", conditions=[scheduled, {"type": "Ready", "status": "False"}],
                             containerStatuses=[{"name": container["name"], "image": container["image"], "ready": False,
                                                 "imageID": "", "restartCount": 0, "state": {"terminated": {
                                                     "exitCode": code if code >= 0 else 128 - code,
                                                     "reason": "Error"}}}])

    def _agent_argv(self, container: dict[str, Any], ip: str, directory: str) -> list[str]:
        """The container's args for the agent, with paths moved into the pod's directory and the agent
        bound to the pod IP (the fake has no container runtime)."""
        args = list(container.get("args", []))
        for flag in ("--state-dir", "--workdir"):
            if flag in args:
                index = args.index(flag) + 1
                if args[index] != ".":
                    args[index] = os.path.join(directory, args[index].lstrip("/"))
                    os.makedirs(args[index], exist_ok=True)
        return [sys.executable, "-m", "orchard.env.agent", *args, "--host", ip]

    async def _probe(self, namespace: str, name: str, container: dict[str, Any], ip: str,
                     running: dict[str, Any], scheduled: dict[str, Any]) -> None:
        probe = container["readinessProbe"]["httpGet"]
        url = f"http://{ip}:{probe['port']}{probe['path']}"
        async with aiohttp.ClientSession() as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as response:
                        if response.status == 200:
                            break
                await asyncio.sleep(0.05)
        self._update_pod(namespace, name, conditions=[scheduled, {"type": "Ready", "status": "True"},
                                                      {"type": "ContainersReady", "status": "True"}],
                         containerStatuses=[{**running, "ready": True}])

    async def _stop_pod(self, name: str) -> None:
        runtime = self.runtimes.pop(name, None)
        if runtime is None:
            return
        if runtime.process is not None and runtime.process.returncode is None:
            # The whole container, as a kubelet stops it: the agent's group and every process below it (the
            # commands it runs lead sessions of their own, and a server one started outlived the suite).
            with contextlib.suppress(psutil.NoSuchProcess):
                below = psutil.Process(runtime.process.pid).children(recursive=True)
                for process in below:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.kill()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(runtime.process.pid, signal.SIGKILL)
            await runtime.process.wait()
        if runtime.task is not None:
            runtime.task.cancel()
        if runtime.directory:
            shutil.rmtree(runtime.directory, ignore_errors=True)
