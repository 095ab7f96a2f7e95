"""What the Kubernetes backend sends: every object validates against the Kubernetes OpenAPI schema,
and the pod and the network policy say what the spec asked for."""

from __future__ import annotations

import ipaddress

import kubernetes_validate
import pytest

from orchard.env.api import TOOLS_DIR, SandboxSpec
from orchard.env.backends.base import SANDBOX_CAPS
from orchard.env.backends.kubernetes.manifests import (
    AGENT_STATE_DIR,
    METADATA_SERVERS,
    SANDBOX_LABEL,
    agent_secret,
    network_policy,
    sandbox_pod,
)
from orchard.env.backends.kubernetes.options import KubernetesOptions
from orchard.env.bundle import AGENT, MOUNT
from tests.conftest import K8S_VERSION

SID = "0123456789abcdef0123456789abcdef"
GKE = KubernetesOptions(runtime_class="gvisor", node_selector={"cloud.google.com/gke-spot": "true"},
                        tolerations=[{"key": "orchard.dev/pool", "operator": "Equal", "value": "sandboxes",
                                      "effect": "NoSchedule"}],
                        image_pull_secrets=["regcred"], priority_class="orchard-sandbox",
                        service_account="orchard-sandbox", images={"swe-base": "ghcr.io/acme/swe-base:1.2"})
READ_ONLY = KubernetesOptions(read_only_root=True)
SPECS = [
    SandboxSpec(),
    SandboxSpec(image="swe-base", workdir="/testbed", cpu=0.5, memory="2Gi", disk="10Gi", env={"A": "1"}, ttl=90),
    SandboxSpec(image="us-docker.pkg.dev/p/r/task@sha256:" + "a" * 64, network="host", dns=True),
    SandboxSpec(egress=["10.0.0.0/8", "169.254.0.0/16", "2001:db8::/32"], dns=True),
    SandboxSpec(workdir="/tmp/"),
]
SPEC_IDS = ["default", "image", "host-network", "egress", "workdir-in-tmp"]
OPTIONS = [KubernetesOptions(), GKE, READ_ONLY]
OPTION_IDS = ["defaults", "gke", "read-only-root"]
# The local backend's capabilities (Docker's default set less mknod) in Kubernetes' spelling, less NET_RAW.
EXPECTED_CAPS = {"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
                 "NET_BIND_SERVICE", "SYS_CHROOT", "AUDIT_WRITE", "SETFCAP"}


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_every_object_validates_against_the_kubernetes_schema(spec, options):
    for manifest in (sandbox_pod(SID, spec, options), network_policy(SID, spec, options),
                     agent_secret(SID, "t0ken", spec, options)):
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        assert manifest["metadata"]["labels"][SANDBOX_LABEL] == SID


def test_the_pod_runs_the_bundled_agent_in_the_task_image_with_the_spec_s_resources():
    spec = SPECS[1]
    pod = sandbox_pod(SID, spec, GKE)
    container = pod["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/acme/swe-base:1.2"  # the short name, mapped
    assert container["command"] == [AGENT]
    assert container["args"][container["args"].index("--workdir") + 1] == "/testbed"
    assert container["workingDir"] == "/testbed"
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": "2Gi", "ephemeral-storage": "10Gi"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": GKE.agent_port}
    assert {"name": "A", "value": "1"} in container["env"]
    token = next(e for e in container["env"] if e["name"] == "ORCHARD_AGENT_TOKEN")
    assert "value" not in token and token["valueFrom"]["secretKeyRef"]["name"] == f"sb-{SID}-agent"
    init = pod["spec"]["initContainers"][0]
    assert init["image"] == GKE.bundle_image and init["volumeMounts"][0]["mountPath"] == "/.orchard"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["runtimeClassName"] == "gvisor" and pod["spec"]["priorityClassName"] == "orchard-sandbox"
    assert pod["spec"]["nodeSelector"] == GKE.node_selector and pod["spec"]["tolerations"] == GKE.tolerations
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    # No workdir in the spec and a writable root: the agent starts in the image's WORKDIR, no workingDir overrides it.
    default = sandbox_pod(SID, SandboxSpec(), KubernetesOptions(read_only_root=False))["spec"]["containers"][0]
    assert "workingDir" not in default and default["args"][default["args"].index("--workdir") + 1] == "."
    assert default["image"] == KubernetesOptions().default_image


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_the_pod_and_every_container_run_under_seccomp_without_privileges(spec, options):
    pod = sandbox_pod(SID, spec, options)
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    containers = pod["spec"]["initContainers"] + pod["spec"]["containers"]
    assert [c["name"] for c in containers] == ["orchard-bundle", "sandbox"]
    for container in containers:
        context = container["securityContext"]
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert context["allowPrivilegeEscalation"] is False
        assert context["privileged"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
    # The init container writes only into the bundle's emptyDir: nothing else of it is writable,
    # and it keeps no capability at all.
    init = pod["spec"]["initContainers"][0]
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert "add" not in init["securityContext"]["capabilities"]
    assert init["volumeMounts"] == [{"name": "orchard", "mountPath": MOUNT}]


def test_the_sandbox_keeps_the_local_backend_s_capabilities_less_net_raw():
    for options in OPTIONS:
        capabilities = sandbox_pod(SID, SandboxSpec(), options)["spec"]["containers"][0]["securityContext"][
            "capabilities"]
        assert capabilities["drop"] == ["ALL"]
        added = capabilities["add"]
        assert len(added) == len(set(added)) == 12
        assert set(added) == EXPECTED_CAPS
        assert "NET_RAW" not in added and "SYS_ADMIN" not in added and "MKNOD" not in added
    # The same set as the local backend's, whose spelling is lower-case without CAP_.
    assert {cap.upper() for cap in SANDBOX_CAPS} - {"NET_RAW"} == EXPECTED_CAPS
    assert "net_raw" in SANDBOX_CAPS


def _sandbox_mounts(pod: dict) -> dict[str, dict]:
    """The sandbox container's mounts by path, each with the volume it mounts."""
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    paths = [m["mountPath"] for m in mounts]
    assert len(paths) == len(set(paths)), paths  # the API server refuses a path mounted twice
    return {m["mountPath"]: {**m, "volume": volumes[m["name"]]} for m in mounts}


def test_a_read_only_root_is_on_by_default_and_can_be_turned_off():
    assert KubernetesOptions().read_only_root is True
    writable = sandbox_pod(SID, SPECS[1], KubernetesOptions())
    assert writable["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    pod = sandbox_pod(SID, SPECS[1], KubernetesOptions(read_only_root=False))
    assert "readOnlyRootFilesystem" not in pod["spec"]["containers"][0]["securityContext"]
    assert list(_sandbox_mounts(pod)) == [MOUNT]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["orchard"]


def test_a_read_only_root_leaves_writable_only_the_workdir_tmp_the_tools_and_the_agent_s_state():
    pod = sandbox_pod(SID, SPECS[1], READ_ONLY)  # workdir /testbed
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = _sandbox_mounts(pod)
    assert set(mounts) == {MOUNT, "/testbed", "/tmp", TOOLS_DIR, AGENT_STATE_DIR}
    assert mounts[MOUNT]["readOnly"] is True and mounts[MOUNT]["name"] == "orchard"
    for path in ("/testbed", "/tmp", TOOLS_DIR, AGENT_STATE_DIR):
        assert mounts[path]["volume"]["emptyDir"] == {}
        assert mounts[path].get("readOnly", False) is False
    assert len({mounts[p]["name"] for p in mounts}) == 5  # each its own volume
    assert container["workingDir"] == "/testbed"
    assert container["args"][container["args"].index("--workdir") + 1] == "/testbed"
    assert container["args"][container["args"].index("--state-dir") + 1] == AGENT_STATE_DIR

    # No workdir in the spec: the image's WORKDIR would be read-only, so the sandbox gets /workspace.
    default = sandbox_pod(SID, SandboxSpec(), READ_ONLY)
    kubernetes_validate.validate(default, K8S_VERSION, strict=True)
    container = default["spec"]["containers"][0]
    assert container["workingDir"] == "/workspace"
    assert container["args"][container["args"].index("--workdir") + 1] == "/workspace"
    assert set(_sandbox_mounts(default)) == {MOUNT, "/workspace", "/tmp", TOOLS_DIR, AGENT_STATE_DIR}

    # A workdir that is one of the other writable paths is mounted once.
    in_tmp = sandbox_pod(SID, SandboxSpec(workdir="/tmp/"), READ_ONLY)
    assert set(_sandbox_mounts(in_tmp)) == {MOUNT, "/tmp", TOOLS_DIR, AGENT_STATE_DIR}
    assert len(in_tmp["spec"]["volumes"]) == 4


def test_read_only_root_is_an_option_of_the_backend_file(tmp_path):
    path = tmp_path / "backend.yaml"
    path.write_text("read_only_root: false\n")
    assert KubernetesOptions.load(str(path)).read_only_root is False


def _allowed(policy: dict) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(peer["ipBlock"]["cidr"]) for rule in policy["spec"]["egress"]
            for peer in rule["to"] if "ipBlock" in peer]


def _reachable(policy: dict, address: str) -> bool:
    ip = ipaddress.ip_address(address)
    for rule in policy["spec"]["egress"]:
        for peer in rule["to"]:
            block = peer.get("ipBlock")
            if block and ip in ipaddress.ip_network(block["cidr"]) and not any(
                    ip in ipaddress.ip_network(e) for e in block.get("except", [])):
                return True
    return False


def test_egress_is_denied_unless_asked_for_and_never_reaches_the_metadata_server():
    options = KubernetesOptions()
    closed = network_policy(SID, SandboxSpec(), options)
    assert closed["spec"]["policyTypes"] == ["Ingress", "Egress"] and closed["spec"]["egress"] == []

    host = network_policy(SID, SandboxSpec(network="host"), options)
    assert _reachable(host, "8.8.8.8") and _reachable(host, "2001:4860::8888")
    listed = network_policy(SID, SandboxSpec(egress=["10.0.0.0/8", "169.254.0.0/16"]), options)
    assert _reachable(listed, "10.1.2.3") and not _reachable(listed, "8.8.8.8")
    for policy in (host, listed):
        for server in METADATA_SERVERS:
            assert not _reachable(policy, server.split("/")[0])
    # A CIDR inside the metadata server's is dropped whole (an except must lie inside its block).
    only_metadata = network_policy(SID, SandboxSpec(egress=["169.254.169.254/32"]), options)
    assert _allowed(only_metadata) == []
    assert not any("ports" in rule and rule["ports"][0]["port"] == 53 for rule in closed["spec"]["egress"])
    dns = network_policy(SID, SandboxSpec(dns=True), options)
    assert dns["spec"]["egress"][0]["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def test_only_the_orchestrator_may_reach_the_agent():
    policy = network_policy(SID, SandboxSpec(), KubernetesOptions(orchestrator_namespace="ops"))
    assert policy["spec"]["podSelector"] == {"matchLabels": {SANDBOX_LABEL: SID}}
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8701}]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}
    assert peer["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "orchard-orchestrator"}}


def test_bad_egress_and_image_names_are_refused_before_anything_is_sent():
    from pydantic import ValidationError

    for bad in ({"egress": ["10.0.0.0/33"]}, {"egress": ["example.com"]}, {"image": "a/../b"}, {"image": "/etc"}):
        with pytest.raises(ValidationError):
            SandboxSpec(**bad)


def test_options_files_refuse_unknown_keys(tmp_path):
    path = tmp_path / "backend.yaml"
    path.write_text("namespace: sbx\nruntime_class: gvisor\nimages: {swe: ghcr.io/a/b:1}\n")
    options = KubernetesOptions.load(str(path))
    assert (options.namespace, options.runtime_class, options.image_reference("swe")) == ("sbx", "gvisor",
                                                                                         "ghcr.io/a/b:1")
    path.write_text("namespcae: sbx\n")
    with pytest.raises(ValueError, match="namespcae"):
        KubernetesOptions.load(str(path))
