"""What the Kubernetes backend sends: every object validates against the Kubernetes OpenAPI schema,
and the pod and the network policy say what the spec asked for."""

from __future__ import annotations

import ipaddress

import kubernetes_validate
import pytest

from orchard.env.api import SandboxSpec
from orchard.env.backends.kubernetes.manifests import (
    METADATA_SERVERS,
    SANDBOX_LABEL,
    agent_secret,
    network_policy,
    sandbox_pod,
)
from orchard.env.backends.kubernetes.options import KubernetesOptions
from orchard.env.bundle import AGENT
from tests.conftest import K8S_VERSION

SID = "0123456789abcdef0123456789abcdef"
GKE = KubernetesOptions(runtime_class="gvisor", node_selector={"cloud.google.com/gke-spot": "true"},
                        tolerations=[{"key": "orchard.dev/pool", "operator": "Equal", "value": "sandboxes",
                                      "effect": "NoSchedule"}],
                        image_pull_secrets=["regcred"], priority_class="orchard-sandbox",
                        service_account="orchard-sandbox", images={"swe-base": "ghcr.io/acme/swe-base:1.2"})
SPECS = [
    SandboxSpec(),
    SandboxSpec(image="swe-base", workdir="/testbed", cpu=0.5, memory="2Gi", disk="10Gi", env={"A": "1"}, ttl=90),
    SandboxSpec(image="us-docker.pkg.dev/p/r/task@sha256:" + "a" * 64, network="host", dns=True),
    SandboxSpec(egress=["10.0.0.0/8", "169.254.0.0/16", "2001:db8::/32"], dns=True),
]


@pytest.mark.parametrize("options", [KubernetesOptions(), GKE], ids=["defaults", "gke"])
@pytest.mark.parametrize("spec", SPECS, ids=["default", "image", "host-network", "egress"])
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
    # No workdir in the spec: the agent starts in the image's WORKDIR and no workingDir overrides it.
    default = sandbox_pod(SID, SandboxSpec(), KubernetesOptions())["spec"]["containers"][0]
    assert "workingDir" not in default and default["args"][default["args"].index("--workdir") + 1] == "."
    assert default["image"] == KubernetesOptions().default_image


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
