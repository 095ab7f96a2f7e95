"""The Kubernetes backend end to end: real orchestrator processes, the real ``kubernetes`` client, and
the in-process fake API server (``fake_api``) whose kubelet runs each pod's agent on its pod IP."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import httpx
import psutil
import pytest
import yaml
from kubernetes import client
from kubernetes import config as kube_config

from benchmarks.ports import start_echo_server
from orchard.env.api import SandboxSpec
from orchard.env.backends.kubernetes.manifests import agent_secret, network_policy, owned_by, sandbox_pod
from orchard.env.backends.kubernetes.options import (
    DEFAULT_BUNDLE_IMAGE,
    DEFAULT_SANDBOX_IMAGE,
    KubernetesOptions,
)
from orchard.env.backends.kubernetes.watcher import PodWatcher
from orchard.env.client import AgentUnavailable, BackendUnavailable, ImageNotFound, SandboxNotFound
from orchard.env.local import local_server
from tests.conftest import wait_until
from tests.env.backends.kubernetes.fake_api import FakeKubernetes

NAMESPACE = "orchard-sandboxes"
TASK_IMAGE = "ghcr.io/acme/swe-base:1.2"


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    api = FakeKubernetes(str(tmp_path_factory.mktemp("fake-k8s")), {DEFAULT_BUNDLE_IMAGE, DEFAULT_SANDBOX_IMAGE,
                                                                     TASK_IMAGE}, bookmark_interval=0.2).start()
    yield api
    api.stop()


def backend_args(fake: FakeKubernetes, directory, owner: str) -> list[str]:
    options = directory / f"{owner}.yaml"
    options.write_text(yaml.safe_dump({"namespace": NAMESPACE, "images": {"swe-base": TASK_IMAGE},
                                       "ready_timeout": 30, "watch_timeout": 5, "owner": owner}))
    return ["--backend", "kubernetes", "--k8s-config", str(options),
            "--kubeconfig", fake.kubeconfig(str(directory / "kubeconfig"))]


@pytest.fixture(scope="module")
def orchestrator(fake, tmp_path_factory):
    args = backend_args(fake, tmp_path_factory.mktemp("k8s-config"), "solo")
    with local_server(extra_args=args, reap_interval=0.5) as server:
        yield server


def objects_of(fake: FakeKubernetes, sandbox_id: str) -> list[str]:
    return sorted(f"{resource}/{o['metadata']['name']}" for resource in ("pods", "secrets", "networkpolicies")
                  for o in fake.list_objects(resource, NAMESPACE)
                  if o["metadata"]["labels"].get("orchard.dev/sandbox") == sandbox_id)


def test_a_sandbox_is_a_pod_and_exec_and_files_go_straight_to_its_agent(fake, orchestrator):
    client = orchestrator.client()
    with client.create(image="swe-base", env={"GREETING": "hello"}, cpu=0.5, memory="256Mi") as sb:
        assert objects_of(fake, sb.id) == [f"networkpolicies/sb-{sb.id}", f"pods/sb-{sb.id}",
                                           f"secrets/sb-{sb.id}-agent"]
        pod = fake.list_objects("pods", NAMESPACE)[0]
        assert pod["spec"]["containers"][0]["image"] == TASK_IMAGE
        assert pod["status"]["podIP"].startswith("127.0.0.") and pod["status"]["podIP"] != "127.0.0.1"
        token_env = next(e for e in pod["spec"]["containers"][0]["env"] if e["name"] == "ORCHARD_AGENT_TOKEN")
        assert "value" not in token_env  # the token reaches the pod only through its Secret
        before = list(fake.requests)
        for _ in range(10):
            assert sb.exec("echo $GREETING").check().stdout == "hello\n"
        sb.write_file("notes/a.txt", b"\x00binary\xff")
        assert sb.read_file("notes/a.txt") == b"\x00binary\xff"
        # The hot path never touches the API server (the reaper's periodic LISTs name no sandbox).
        assert [request for request in fake.requests[len(before):] if sb.id in request[1]] == []
        # Readiness came from the watch: nobody asked the API for this pod.
        assert ("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/sb-{sb.id}") not in fake.requests
        sandbox_id = sb.id
    assert objects_of(fake, sandbox_id) == []


def test_an_image_that_cannot_be_pulled_is_a_clear_error_and_leaves_nothing(fake, orchestrator):
    client = orchestrator.client()
    with pytest.raises(ImageNotFound, match=r"ErrImagePull.*ghcr.io/acme/missing:9"):
        client.create(image="ghcr.io/acme/missing:9")
    wait_until(lambda: fake.list_objects("pods", NAMESPACE) == [], what="the failed pod deleted")
    assert fake.list_objects("secrets", NAMESPACE) == fake.list_objects("networkpolicies", NAMESPACE) == []


def test_an_unschedulable_pod_is_reported_with_the_scheduler_s_reason(fake, orchestrator):
    client = orchestrator.client()
    fake.call(setattr, fake, "schedulable", False)
    try:
        sb = client.create(wait=False)
        with pytest.raises(BackendUnavailable, match=r"not ready after 2s.*Unschedulable: 0/3 nodes are available"):
            sb.wait_ready(timeout=2)
    finally:
        fake.call(setattr, fake, "schedulable", True)
    assert objects_of(fake, sb.id) == []


def test_an_agent_that_dies_is_a_clear_error_and_deleting_its_sandbox_cleans_up(fake, orchestrator):
    client = orchestrator.client()
    sb = client.create()
    fake.kill_agent(f"sb-{sb.id}")
    with pytest.raises(AgentUnavailable):
        sb.exec("true")
    wait_until(lambda: fake.list_objects("pods", NAMESPACE)[0]["status"]["phase"] == "Failed",
               what="the pod failed")
    sb.delete()
    assert objects_of(fake, sb.id) == []


def test_warm_pools_work_on_kubernetes_too(fake, orchestrator):
    client = orchestrator.client()
    client.set_pool(1, image="swe-base", memory="384Mi")
    try:
        wait_until(lambda: [p.ready for p in client.pools()] == [1], timeout=30, what="the pool to fill")
        (idle,) = fake.list_objects("pods", NAMESPACE)
        with client.create(image="swe-base", memory="384Mi") as claimed:
            assert f"sb-{claimed.id}" == idle["metadata"]["name"]  # a claim, not a new pod
            assert claimed.exec("echo pooled").check().stdout == "pooled\n"
    finally:
        client.set_pool(0, image="swe-base", memory="384Mi")
    wait_until(lambda: fake.list_objects("pods", NAMESPACE) == [], timeout=30, what="the pool's pods deleted")


def test_the_egress_a_spec_asks_for_is_its_network_policy(fake, orchestrator):
    client = orchestrator.client()
    with client.create(egress=["10.0.0.0/8"], dns=True) as sb:
        (policy,) = fake.list_objects("networkpolicies", NAMESPACE)
        assert policy["spec"]["egress"][0]["to"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
        assert sb.exec("true").exit_code == 0


def test_two_replicas_share_sandboxes_and_a_restarted_one_reaps_orphans(fake, redis_url, tmp_path):
    # Its own owner label: the module's orchestrator (another deployment, another store) must not
    # take these sandboxes for orphans, nor these replicas its.
    k8s_args = backend_args(fake, tmp_path, "replicas")
    store = redis_url.rsplit("/", 1)[0] + "/5"
    first = local_server(store=store, extra_args=k8s_args, reap_interval=0.5)
    second = local_server(store=store, extra_args=k8s_args, reap_interval=0.5)
    try:
        sb = first.client().create(heartbeat=False, ttl=120)
        other = second.client().get(sb.id)
        assert other.exec("echo hi").check().stdout == "hi\n"
        assert sb.id in {info.id for info in second.client().list()}

        # An orchestrator dies; meanwhile something leaves a sandbox's objects with no record.
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        orphan = "f" * 32
        spec, options = SandboxSpec(), KubernetesOptions(namespace=NAMESPACE, owner="replicas")
        fake.create_object("secrets", NAMESPACE, agent_secret(orphan, "x", spec, options))
        fake.create_object("networkpolicies", NAMESPACE, network_policy(orphan, spec, options))
        fake.create_object("pods", NAMESPACE, sandbox_pod(orphan, spec, options))
        restarted = local_server(store=store, extra_args=k8s_args, reap_interval=0.5)
        try:
            wait_until(lambda: objects_of(fake, orphan) == [], timeout=20, what="the orphan reaped")
            # The live sandbox was re-adopted, not reaped, and both replicas still serve it.
            assert restarted.client().get(sb.id).exec("echo still").check().stdout == "still\n"
            second.client().delete(sb.id)
            with pytest.raises(SandboxNotFound):
                restarted.client().get(sb.id).exec("true")
            assert objects_of(fake, sb.id) == []
        finally:
            restarted.stop()
    finally:
        first.stop()
        second.stop()


async def test_the_watcher_relists_after_410_gone_and_sees_what_changed_meanwhile(fake, tmp_path):
    api = kube_config.new_client_from_config(config_file=fake.kubeconfig(str(tmp_path / "kubeconfig")))
    options, spec = KubernetesOptions(namespace="watcher-test"), SandboxSpec(image="ghcr.io/never/pulled:1")
    watcher = PodWatcher(client.CoreV1Api(api), "watcher-test", owned_by(options), watch_timeout=30)
    first, second = "a" * 32, "b" * 32
    fake.create_object("pods", "watcher-test", sandbox_pod(first, spec, options))
    watcher.start()
    try:
        await watcher.wait_for(first, lambda state: state is not None and state.failure is not None, 10)
        await asyncio.wait_for(_until(lambda: watcher.bookmarks > 0), 10)

        # Cut the watcher off, change things, and compact the history it would resume from.
        fake.hold_watches(True)
        fake.drop_watches()
        await asyncio.to_thread(fake.delete_object, "pods", "watcher-test", f"sb-{first}")
        await asyncio.to_thread(fake.create_object, "pods", "watcher-test", sandbox_pod(second, spec, options))
        fake.compact()
        fake.hold_watches(False)

        gone = await watcher.wait_for(first, lambda state: state is None, 10)
        assert gone is None
        await watcher.wait_for(second, lambda state: state is not None, 10)
        assert watcher.relists >= 1
        assert "ErrImagePull" in watcher.pods[second].failure
    finally:
        await watcher.stop()
        api.close()


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.05)


def test_a_port_forward_reaches_a_server_in_the_pod(orchestrator):
    """The SDK's port forward goes through the orchestrator to the pod's agent and on to a server
    listening on the pod's own loopback, HTTP and WebSocket, as on the local backend."""
    client = orchestrator.client()
    with client.create(image="swe-base", memory="256Mi") as sb:
        port = sb.run_async(start_echo_server)
        reply = httpx.post(sb.port_url(port, "/echo/k8s"), content=b"ping", headers=sb.port_headers, timeout=30)
        assert reply.status_code == 200 and reply.json()["body"] == "ping"
        assert httpx.get(sb.port_url(port, "/echo/k8s"), timeout=30).status_code == 401

        async def talk() -> str:
            async with aiohttp.ClientSession() as http, \
                    http.ws_connect(sb.port_url(port, "/ws", websocket=True), headers=sb.port_headers) as ws:
                await ws.send_str("hi")
                return await ws.receive_str()

        assert asyncio.run(talk()).startswith("echo: hi")
        server = [p for p in psutil.process_iter(["cmdline"]) if "echo_server.py" in " ".join(p.info["cmdline"] or [])
                  and any(c.laddr.port == port for c in p.net_connections("tcp"))]
    assert len(server) == 1  # the pod's server, a host process under the fake kubelet
    wait_until(lambda: not server[0].is_running() or server[0].status() == psutil.STATUS_ZOMBIE,
               what="the pod's server to go with the pod")  # the fake left it running after the suite
