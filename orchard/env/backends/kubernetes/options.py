"""What the Kubernetes backend is told about its cluster: ``--k8s-config backend.yaml``.

The file is a ConfigMap in ``infra/k8s`` (key ``backend.yaml``); every key is optional::

    namespace: orchard-sandboxes        # where sandbox pods go
    bundle_image: ghcr.io/...:0.1.0     # init image with the agent bundle (`orchard env bundle`) at /bundle
    default_image: ghcr.io/...:0.1.0    # sandboxes whose spec names no image
    orchestrator_namespace: orchard     # only the orchestrator's pods may reach a sandbox's agent
    orchestrator_labels: {app.kubernetes.io/name: orchard-orchestrator}
    agent_port: 8701
    runtime_class: gvisor               # GKE Sandbox; null: the cluster's default runtime
    node_selector: {cloud.google.com/gke-spot: "true"}
    tolerations: [{key: orchard.dev/pool, operator: Equal, value: sandboxes, effect: NoSchedule}]
    image_pull_secrets: [regcred]
    priority_class: orchard-sandbox
    service_account: orchard-sandbox    # its token is never mounted
    images: {swe-base: ghcr.io/...}     # short names clients may use for image references
    ready_timeout: 300                  # seconds from create to Ready (scheduling, pull, probe)
    owner: orchard                      # the orchard.dev/owner label: which deployment owns a pod
    read_only_root: true                # read-only image root; writable emptyDirs at workdir, /tmp, tools, agent state
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml

DEFAULT_BUNDLE_IMAGE = "ghcr.io/orchard-ai/orchard-agent-bundle:0.1.0"
DEFAULT_SANDBOX_IMAGE = "ghcr.io/orchard-ai/orchard-swe-base:0.1.0"  # infra/images/swe-sandbox.Dockerfile


@dataclass(frozen=True)
class KubernetesOptions:
    namespace: str = "orchard-sandboxes"
    bundle_image: str = DEFAULT_BUNDLE_IMAGE
    default_image: str = DEFAULT_SANDBOX_IMAGE
    orchestrator_namespace: str = "orchard"
    orchestrator_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "orchard-orchestrator"})
    agent_port: int = 8701
    runtime_class: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)
    priority_class: str | None = None
    service_account: str | None = None
    images: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 300.0
    owner: str = "orchard"
    # Seconds a watch runs before it is renewed from its last resourceVersion (the API server also
    # ends watches on its own, after 5-10 minutes).
    watch_timeout: int = 240
    # The sandbox container's root filesystem read-only (``readOnlyRootFilesystem``), with writable
    # emptyDirs at only the paths a sandbox must write: its workdir (``/workspace`` when the spec
    # names none, since the image's WORKDIR would be read-only), /tmp, the tools directory
    # (``orchard.env.api.TOOLS_DIR``: tasks' shims and tools, first on PATH) and the agent's state dir.
    # On by default. An emptyDir at the workdir hides what the image has there: turn it off for
    # images that bake a task's files into their WORKDIR (a repo at /testbed) rather than have
    # them uploaded, or that install into system paths at run time.
    read_only_root: bool = True

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> KubernetesOptions:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown Kubernetes backend option(s) {unknown}; known: {sorted(known)}")
        return cls(**{k: v for k, v in values.items() if v is not None})

    @classmethod
    def load(cls, path: str | None) -> KubernetesOptions:
        """Options from a YAML file, or the defaults when ``path`` is None."""
        if path is None:
            return cls()
        with open(path) as handle:
            values = yaml.safe_load(handle) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a mapping of options, got {type(values).__name__}")
        return cls.from_dict(values)

    def image_reference(self, name: str | None) -> str:
        """A client's image name as the kubelet should pull it: a short name this orchestrator maps,
        or already a reference; no name: the default sandbox image."""
        return self.images.get(name, name) if name else self.default_image
