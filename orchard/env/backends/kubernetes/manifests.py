"""The objects one sandbox is made of on Kubernetes: a Secret, a NetworkPolicy and a Pod.

Pure functions from a spec to plain dicts, so that tests can validate exactly what is sent against
the Kubernetes OpenAPI schemas. Every object carries the ``orchard.dev/sandbox`` label, which is how
the backend finds them again (and the reaper finds orphans).

Where the pod departs from the local backend:

- ``spec.pids`` has no per-pod field: the kubelet's ``podPidsLimit`` bounds every pod of a node.
- ``spec.disk`` is the container's ``ephemeral-storage`` limit: past it the kubelet evicts the pod,
  where the local backend answers ENOSPC.
- ``spec.workdir`` unset keeps the image's WORKDIR (``/`` if it has none), where the local backend
  defaults to ``/workspace``.
- Commands run as the image's USER, chosen by the container runtime (locally: ``setpriv``).

The hardening, the same intent as the local backend's (no new privileges, a seccomp filter, a
small capability set):

- ``seccompProfile: RuntimeDefault`` on the pod and on every container.
- Every container: ``allowPrivilegeEscalation: false`` and ``privileged: false``.
- The sandbox container drops ALL capabilities and adds back the local backend's set
  (``SANDBOX_CAPS``, Docker's default less mknod) less NET_RAW: no raw sockets, so no ICMP/ARP
  spoofing inside the cluster network.
- The init container keeps no capability and has a read-only root (it writes only into the
  bundle's emptyDir).
- ``KubernetesOptions.read_only_root`` (on by default) makes the sandbox container's root
  read-only too, with writable emptyDirs at its workdir (``/workspace`` when the spec names none),
  ``/tmp``, the tools directory (:data:`~orchard.env.api.TOOLS_DIR`) and the agent's state dir.
"""

from __future__ import annotations

import ipaddress
import posixpath
from typing import Any

from orchard.env.api import TOOLS_DIR, SandboxSpec
from orchard.env.backends.base import SANDBOX_CAPS
from orchard.env.backends.kubernetes.options import KubernetesOptions
from orchard.env.bundle import AGENT, MOUNT

SANDBOX_LABEL = "orchard.dev/sandbox"
OWNER_LABEL = "orchard.dev/owner"
TTL_LABEL = "orchard.dev/ttl-seconds"
COMPONENT_LABELS = {"app.kubernetes.io/name": "orchard-sandbox", "app.kubernetes.io/managed-by": "orchard"}


def owned_by(options: KubernetesOptions) -> str:
    """The label selector of this deployment's sandbox objects: orchestrators with another ``owner``
    (a dev and a prod deployment in one namespace) never see, nor reap, each other's sandboxes."""
    return f"{SANDBOX_LABEL},app.kubernetes.io/managed-by=orchard,{OWNER_LABEL}={options.owner}"

TOKEN_KEY = "token"
TOKEN_ENV = "ORCHARD_AGENT_TOKEN"
AGENT_STATE_DIR = "/tmp/.orchard-agent"
# Cloud metadata servers (GCE/GKE, AWS, Azure: 169.254.169.254; GKE's workload-identity server:
# 169.254.169.252). No sandbox may reach them, whatever its spec allows.
METADATA_SERVERS = ("169.254.169.254/32", "169.254.169.252/32")
EVERYWHERE = ("0.0.0.0/0", "::/0")
# What the sandbox container adds back after dropping ALL: the local backend's set, in Kubernetes'
# spelling, less NET_RAW (raw sockets would let a sandbox spoof packets on the cluster network).
CAPABILITIES = tuple(cap.upper() for cap in SANDBOX_CAPS if cap != "net_raw")
SECCOMP = {"type": "RuntimeDefault"}
# The workdir of a read-only-root sandbox whose spec names none (the local backend's default).
READ_ONLY_WORKDIR = "/workspace"


def pod_name(sandbox_id: str) -> str:
    return f"sb-{sandbox_id}"


def secret_name(sandbox_id: str) -> str:
    return f"sb-{sandbox_id}-agent"


def sandbox_id_of(labels: dict[str, str] | None) -> str | None:
    return (labels or {}).get(SANDBOX_LABEL)


def _metadata(name: str, sandbox_id: str, options: KubernetesOptions, spec: SandboxSpec) -> dict[str, Any]:
    labels = {**COMPONENT_LABELS, SANDBOX_LABEL: sandbox_id, OWNER_LABEL: options.owner,
              TTL_LABEL: str(int(spec.ttl))}
    return {"name": name, "namespace": options.namespace, "labels": labels}


def agent_secret(sandbox_id: str, token: str, spec: SandboxSpec, options: KubernetesOptions) -> dict[str, Any]:
    """The agent's bearer token, handed to the pod by reference (it never appears in the pod spec)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _metadata(secret_name(sandbox_id), sandbox_id, options, spec),
            "stringData": {TOKEN_KEY: token}}


def sandbox_pod(sandbox_id: str, spec: SandboxSpec, options: KubernetesOptions) -> dict[str, Any]:
    """One sandbox: an init container copies the agent bundle into an emptyDir at ``/.orchard``; the
    task's image runs the agent from there instead of its own entrypoint."""
    resources = {"cpu": f"{round(spec.cpu * 1000)}m", "memory": spec.memory}
    if spec.disk:
        resources["ephemeral-storage"] = spec.disk
    # A read-only root leaves the image's WORKDIR unwritable: such a sandbox gets /workspace instead.
    workdir = spec.workdir or (READ_ONLY_WORKDIR if options.read_only_root else None)
    args = ["--port", str(options.agent_port), "--state-dir", AGENT_STATE_DIR]
    args += ["--workdir", workdir or "."]  # ".": the image's WORKDIR, where the runtime starts it
    container: dict[str, Any] = {
        "name": "sandbox",
        "image": options.image_reference(spec.image),
        "command": [AGENT],
        "args": args,
        "env": [{"name": k, "value": v} for k, v in spec.env.items()]
        + [{"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": secret_name(sandbox_id), "key": TOKEN_KEY}}}],
        "ports": [{"name": "agent", "containerPort": options.agent_port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": options.agent_port},
                           "periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 3},
        "resources": {"requests": resources, "limits": dict(resources)},
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                            "capabilities": {"drop": ["ALL"], "add": list(CAPABILITIES)},
                            "seccompProfile": dict(SECCOMP)},
        "volumeMounts": [{"name": "orchard", "mountPath": MOUNT, "readOnly": True}],
    }
    if workdir:
        container["workingDir"] = workdir
    volumes: list[dict[str, Any]] = [{"name": "orchard", "emptyDir": {"sizeLimit": "512Mi"}}]
    if options.read_only_root:
        container["securityContext"]["readOnlyRootFilesystem"] = True
        # One mount per path (a workdir of /tmp would otherwise be mounted twice); nothing over "/".
        writable = (workdir or READ_ONLY_WORKDIR, "/tmp", TOOLS_DIR, AGENT_STATE_DIR)
        paths = dict.fromkeys(posixpath.normpath(p) for p in writable)
        for i, path in enumerate(p for p in paths if p != "/"):
            volumes.append({"name": f"writable-{i}", "emptyDir": {}})
            container["volumeMounts"].append({"name": f"writable-{i}", "mountPath": path})
    init = {
        "name": "orchard-bundle",
        "image": options.bundle_image,
        "command": ["cp", "-a", "/bundle/.", f"{MOUNT}/"],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                            "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
                            "seccompProfile": dict(SECCOMP)},
        "volumeMounts": [{"name": "orchard", "mountPath": MOUNT}],
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostname": "sandbox",
        "terminationGracePeriodSeconds": 1,
        "securityContext": {"seccompProfile": dict(SECCOMP)},
        "initContainers": [init],
        "containers": [container],
        "volumes": volumes,
    }
    optional = {"runtimeClassName": options.runtime_class, "priorityClassName": options.priority_class,
                "serviceAccountName": options.service_account,
                "nodeSelector": dict(options.node_selector) or None,
                "tolerations": [dict(t) for t in options.tolerations] or None,
                "imagePullSecrets": [{"name": n} for n in options.image_pull_secrets] or None}
    pod_spec.update({k: v for k, v in optional.items() if v is not None})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _metadata(pod_name(sandbox_id), sandbox_id, options, spec),
            "spec": pod_spec}


def _allowed_block(cidr: str) -> dict[str, Any] | None:
    """An ipBlock for ``cidr`` less the metadata servers inside it; None if nothing is left."""
    network = ipaddress.ip_network(cidr, strict=False)
    blocked = [ipaddress.ip_network(m) for m in METADATA_SERVERS]
    if any(network.version == m.version and network.subnet_of(m) for m in blocked):
        return None
    inside = [str(m) for m in blocked if m.version == network.version and m.subnet_of(network)]
    block: dict[str, Any] = {"cidr": str(network)}
    if inside:
        block["except"] = inside
    return block


def egress_cidrs(spec: SandboxSpec) -> list[str]:
    return list(EVERYWHERE) if spec.network == "host" else list(spec.egress)


def network_policy(sandbox_id: str, spec: SandboxSpec, options: KubernetesOptions) -> dict[str, Any]:
    """Only the orchestrator may reach the agent; out of the pod, nothing but what the spec asks
    for (``network='host'``: everywhere; ``egress``: those CIDRs; ``dns``: the cluster's DNS), and
    never a metadata server."""
    orchestrator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": options.orchestrator_namespace}},
                    "podSelector": {"matchLabels": dict(options.orchestrator_labels)}}
    egress: list[dict[str, Any]] = []
    blocks = [b for b in map(_allowed_block, egress_cidrs(spec)) if b is not None]
    if blocks:
        egress.append({"to": [{"ipBlock": b} for b in blocks]})
    if spec.dns:
        egress.append({"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                               "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                       "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _metadata(pod_name(sandbox_id), sandbox_id, options, spec),
            "spec": {"podSelector": {"matchLabels": {SANDBOX_LABEL: sandbox_id}},
                     "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": [orchestrator],
                                  "ports": [{"protocol": "TCP", "port": options.agent_port}]}],
                     "egress": egress}}
