"""The Kubernetes backend: sandboxes as pods (see :mod:`.backend`)."""

from orchard.env.backends.kubernetes.backend import KubernetesBackend, api_client
from orchard.env.backends.kubernetes.options import KubernetesOptions

__all__ = ["KubernetesBackend", "KubernetesOptions", "api_client"]
