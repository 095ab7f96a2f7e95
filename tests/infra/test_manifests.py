"""The infra/ tree without a cluster: kustomize builds, schema validation, and the contract.

No Kubernetes API server can run on these machines, so this is what is checked instead:

- ``kubectl kustomize`` (Debian's ``kubernetes-client``, installed by ``make system-deps``) builds the
  base and both overlays. Without kubectl these tests fail; they do not skip.
- Every rendered object, and every object in infra/gke/manifests, validates in strict mode (unknown
  fields are errors) against the Kubernetes OpenAPI schemas shipped by ``kubernetes-validate``, at
  :data:`K8S_VERSION`.
- The semantics the schemas cannot see:
  - the orchestrator's replica count and its PodDisruptionBudget;
  - least-privilege RBAC;
  - the sandbox namespace's default deny;
  - the backend config;
  - resource limits and pinned images;
  - agreement between configs/swe_bar.py, the manifests and the cluster scripts (names, ports,
    the mesh size and device), and of the other paper variants' meshes with the learner slice;
  - how the learner's processes find each other (orchard.distributed): detection on the TPU slice,
    explicit settings on GPU hosts.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import itertools
import math
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml

from orchard.distributed import (
    COORDINATOR_ENV,
    INDEXED_JOB_ENV,
    NUM_PROCESSES_ENV,
    PROCESS_ID_ENV,
    ProcessGroup,
)
from orchard.env.backends.kubernetes.options import KubernetesOptions
from orchard.train.plan import DEVICE_MEMORY
from tests.conftest import K8S_VERSION

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
KUSTOMIZATIONS = {"base": INFRA / "k8s/base", "dev": INFRA / "k8s/overlays/dev", "gke": INFRA / "k8s/overlays/gke"}
GKE_MANIFESTS = sorted((INFRA / "gke/manifests").glob("*.yaml"))
SCRIPTS = sorted((INFRA / "gke").glob("*.sh"))
DOCKERFILES = sorted((INFRA / "images").glob("*.Dockerfile"))


ORCHESTRATOR = {"app.kubernetes.io/name": "orchard-orchestrator"}
BACKEND_KEYS = {"namespace", "bundle_image", "orchestrator_namespace", "orchestrator_labels", "agent_port",
                "runtime_class", "node_selector", "tolerations", "image_pull_secrets", "priority_class", "images",
                "default_image", "service_account"}
# The orchestrator's Role, exactly: (apiGroup, resource, verb).
ROLE_RULES = {
    *(("", "pods", verb) for verb in ("get", "list", "watch", "create", "delete")),
    ("", "pods/status", "get"),
    *(("", "secrets", verb) for verb in ("create", "get", "delete", "list")),
    *(("networking.k8s.io", "networkpolicies", verb) for verb in ("create", "get", "list", "delete")),
    *(("", "events", verb) for verb in ("list", "watch", "get")),
}
GKE_REGISTRY = "us-docker.pkg.dev/PROJECT_ID/orchard/"
# JobSet is a custom resource, absent from the core schemas. Its own fields are checked against these
# names, transcribed from the jobset.x-k8s.io/v1alpha2 CRD (kubernetes-sigs/jobset,
# config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml); each replicated job's template is
# validated as the batch/v1 Job it becomes.
JOBSET_SPEC_FIELDS = {"coordinator", "failurePolicy", "managedBy", "network", "replicatedJobs", "startupPolicy",
                      "successPolicy", "suspend", "ttlSecondsAfterFinished"}
JOBSET_REPLICATED_JOB_FIELDS = {"dependsOn", "groupName", "name", "replicas", "template"}
JOBSET_FAILURE_POLICY_FIELDS = {"maxRestarts", "restartStrategy", "rules"}
JOBSET_NETWORK_FIELDS = {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"}
# The learner's manifests: the TPU slice's (JAX detects its peers) and the GPU hosts' (explicit settings).
TPU_LEARNER = INFRA / "gke/manifests/learner-jobset.yaml"
GPU_LEARNER = INFRA / "gke/manifests/learner-jobset-gpu.yaml"
# The paper variants that train on the learner slice: each one's mesh is the whole slice.
SLICE_VARIANTS = ("swe_bar.py:qwen3_30b_a3b", "swe_sft.py:qwen3_30b_a3b", "claw_grpo.py:qwen3_30b_a3b",
                  "gui_grpo.py:qwen3vl_4b")


# --- helpers -----------------------------------------------------------------------------------------


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not installed: run `make system-deps` (Debian package kubernetes-client)")
    return path


@functools.cache
def _render(name: str) -> tuple[dict, ...]:
    done = subprocess.run([kubectl(), "kustomize", str(KUSTOMIZATIONS[name])], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, f"kubectl kustomize {name} failed:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def render(name: str) -> list[dict]:
    return list(_render(name))


@functools.cache
def _load(path: Path) -> tuple[dict, ...]:
    return tuple(doc for doc in yaml.safe_load_all(path.read_text()) if doc)


def load(path: Path) -> list[dict]:
    return list(_load(path))


def find(docs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind
            and (name is None or d["metadata"]["name"] == name)
            and (namespace is None or d["metadata"].get("namespace") == namespace)]


def one(docs: list[dict], kind: str, name: str, namespace: str | None = None) -> dict:
    found = find(docs, kind, name, namespace)
    assert len(found) == 1, f"expected one {kind} {namespace}/{name}, found {len(found)}"
    return found[0]


def pod_spec(doc: dict) -> dict | None:
    """The pod spec inside a workload (a JobSet's first replicated job's), or None."""
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return doc["spec"]["template"]["spec"]
    if doc["kind"] == "JobSet":
        return doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    if doc["kind"] == "Pod":
        return doc["spec"]
    return None


def pod_specs(doc: dict) -> Iterator[dict]:
    if doc["kind"] == "JobSet":
        for job in doc["spec"]["replicatedJobs"]:
            yield job["template"]["spec"]["template"]["spec"]
    elif (spec := pod_spec(doc)) is not None:
        yield spec


def containers(doc: dict) -> Iterator[dict]:
    for spec in pod_specs(doc):
        yield from spec.get("initContainers", [])
        yield from spec.get("containers", [])


def backend_config(docs: list[dict]) -> dict:
    config_map = one(docs, "ConfigMap", "orchard-backend", "orchard")
    config = yaml.safe_load(config_map["data"]["backend.yaml"])
    assert isinstance(config, dict)
    return config


def orchestrator(docs: list[dict]) -> dict:
    return one(docs, "Deployment", "orchard-orchestrator", "orchard")


def selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector (matchLabels only; matchExpressions unsupported here) matches labels."""
    assert not selector.get("matchExpressions"), "matchExpressions not handled by this test"
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


def split_image(reference: str) -> tuple[str, str | None]:
    """(repository, tag or digest); the tag is None when the reference has neither."""
    if "@" in reference:
        repository, digest = reference.split("@", 1)
        return repository, digest
    slash = reference.rfind("/")
    colon = reference.rfind(":")
    if colon > slash:
        return reference[:colon], reference[colon + 1:]
    return reference, None


def all_images(docs: list[dict]) -> list[str]:
    """Every image a set of objects refers to: containers, and the backend config's images."""
    images = [c["image"] for doc in docs for c in containers(doc)]
    if find(docs, "ConfigMap", "orchard-backend"):
        config = backend_config(docs)
        images += [config["bundle_image"], *config["images"].values()]
    return images


def validation_errors(docs: list[dict]) -> list[str]:
    errors = []
    for doc in docs:
        name = f"{doc['kind']} {doc['metadata'].get('namespace', '')}/{doc['metadata']['name']}"
        if doc["kind"] == "JobSet":
            errors += jobset_errors(doc)
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            errors.append(f"{name}: {path}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{name}: no schema for {doc['apiVersion']} {doc['kind']} in Kubernetes {K8S_VERSION}")
    return errors


def jobset_errors(doc: dict) -> list[str]:
    name = f"JobSet {doc['metadata'].get('namespace', '')}/{doc['metadata']['name']}"
    errors = []
    if doc["apiVersion"] != "jobset.x-k8s.io/v1alpha2":
        errors.append(f"{name}: apiVersion {doc['apiVersion']}")
    if unknown := set(doc["spec"]) - JOBSET_SPEC_FIELDS:
        errors.append(f"{name}: unknown spec fields {sorted(unknown)}")
    if unknown := set(doc["spec"].get("failurePolicy", {})) - JOBSET_FAILURE_POLICY_FIELDS:
        errors.append(f"{name}: unknown failurePolicy fields {sorted(unknown)}")
    if unknown := set(doc["spec"].get("network", {})) - JOBSET_NETWORK_FIELDS:
        errors.append(f"{name}: unknown network fields {sorted(unknown)}")
    for replicated in doc["spec"]["replicatedJobs"]:
        if unknown := set(replicated) - JOBSET_REPLICATED_JOB_FIELDS:
            errors.append(f"{name}: unknown replicatedJobs fields {sorted(unknown)}")
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": f"{doc['metadata']['name']}-{replicated['name']}",
                            **replicated["template"].get("metadata", {})},
               "spec": replicated["template"]["spec"]}
        errors += [f"{name} (replicated job {replicated['name']} as a batch/v1 Job): {error}"
                   for error in validation_errors([job])]
    return errors


def service_port(docs: list[dict], url: str) -> tuple[dict, dict]:
    """The Service (and its port entry) that an in-cluster URL http://<svc>.<ns>.svc:<port> names."""
    parsed = urlparse(url)
    service, namespace, suffix = parsed.hostname.split(".", 2)
    assert suffix in ("svc", "svc.cluster.local"), url
    found = one(docs, "Service", service, namespace)
    ports = [p for p in found["spec"]["ports"] if p["port"] == parsed.port]
    assert ports, f"Service {namespace}/{service} has no port {parsed.port} (for {url})"
    return found, ports[0]


def target_container_port(service: dict, port: dict, workload: dict) -> int:
    """The container port a Service port lands on in a workload it selects."""
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": service["spec"]["selector"]}, labels), \
        f"Service {service['metadata']['name']} does not select {workload['metadata']['name']}"
    target = port.get("targetPort", port["port"])
    for container in containers(workload):
        for container_port in container.get("ports", []):
            if target in (container_port.get("name"), container_port["containerPort"]):
                return container_port["containerPort"]
    raise AssertionError(f"targetPort {target!r} of Service {service['metadata']['name']} matches no container port")


def script_commands(script: Path, **env: str) -> list[list[str]]:
    """The commands a cluster script prints with DRY_RUN=1, split like the shell would."""
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, check=False,
                          env={"PATH": os.environ["PATH"], "DRY_RUN": "1", "PROJECT_ID": "test-project", **env})
    assert done.returncode == 0, f"{script.name} (DRY_RUN=1) failed:\n{done.stderr}"
    return [shlex.split(line) for line in done.stdout.splitlines() if line.startswith(("gcloud ", "kubectl "))]


def flags(command: list[str]) -> dict[str, list[str]]:
    """--flag value pairs of a command (a flag without a value maps to [''])."""
    result: dict[str, list[str]] = {}
    for i, word in enumerate(command):
        if word.startswith("--"):
            name, _, value = word.partition("=")
            if not value and i + 1 < len(command) and not command[i + 1].startswith("--"):
                value = command[i + 1]
            result.setdefault(name, []).append(value)
    return result


def node_pool(commands: list[list[str]], name: str) -> dict[str, list[str]]:
    found = [c for c in commands if c[:4] == ["gcloud", "container", "node-pools", "create"] and c[4] == name]
    assert len(found) == 1, f"create-cluster.sh creates node pool {name!r} {len(found)} times"
    return flags(found[0])


def recipe_config(named: str = "swe_bar.py:qwen3_30b_a3b"):
    file, _, variant = named.partition(":")
    spec = importlib.util.spec_from_file_location(f"config_{file.removesuffix('.py')}", ROOT / "configs" / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant)


def learner_job(path: Path) -> tuple[dict, dict, dict, dict]:
    """A learner manifest's JobSet, its one replicated job, that job's spec and its one container."""
    (jobset,) = load(path)
    assert jobset["kind"] == "JobSet" and jobset["metadata"]["namespace"] == "orchard"
    (replicated,) = jobset["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    (container,) = job["template"]["spec"]["containers"]
    return jobset, replicated, job, container


def container_port(container: dict, name: str) -> int:
    (port,) = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == name]
    return port


# --- kustomize and schemas ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_kustomization_builds_and_validates(name):
    docs = render(name)
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service",
            "PodDisruptionBudget", "StatefulSet", "NetworkPolicy"} <= kinds
    assert not (errors := validation_errors(docs)), "\n".join(errors)


@pytest.mark.parametrize("path", GKE_MANIFESTS, ids=lambda p: p.name)
def test_gke_manifest_validates(path):
    docs = load(path)
    assert docs
    assert not (errors := validation_errors(docs)), "\n".join(errors)


def test_validation_is_strict():
    """A misspelt field fails, so the tests above would notice one."""
    deployment = orchestrator(render("base"))
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    assert validation_errors([broken])
    jobset = one(load(TPU_LEARNER), "JobSet", "orchard-learner")
    job = jobset["spec"]["replicatedJobs"][0]
    broken_job = {**job, "template": {"spec": {**job["template"]["spec"], "paralelism": 1}}}
    assert jobset_errors({**jobset, "spec": {**jobset["spec"], "replicatedJobs": [broken_job]}})
    assert not jobset_errors(jobset)
    assert jobset_errors({**jobset, "spec": {**jobset["spec"], "network": {"enableDnsHostnames": True}}})


def test_manifest_set_is_complete():
    assert [p.name for p in GKE_MANIFESTS] == ["learner-jobset-gpu.yaml", "learner-jobset.yaml", "vllm.yaml"]
    assert [p.name for p in SCRIPTS] == ["create-cluster.sh", "delete-cluster.sh"]


# --- the orchestrator --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_orchestrator_deployment(name):
    docs = render(name)
    deployment = orchestrator(docs)
    assert deployment["spec"]["replicas"] == 2
    template = deployment["spec"]["template"]
    assert selects(deployment["spec"]["selector"], template["metadata"]["labels"])
    assert selects({"matchLabels": ORCHESTRATOR}, template["metadata"]["labels"])
    spec = template["spec"]
    assert spec["serviceAccountName"] == "orchard-orchestrator"
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    args = container["args"]
    assert args == ["--backend", "kubernetes", "--k8s-config", "/etc/orchard/backend.yaml",
                    "--store", "redis://orchard-redis:6379/0", "--host", "0.0.0.0", "--port", "8700"]
    # The backend config is the ConfigMap, mounted where --k8s-config points.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    config_volume = volumes[mounts["/etc/orchard"]["name"]]
    assert config_volume["configMap"]["name"] == "orchard-backend"
    assert "/tmp" in mounts  # writable scratch under a read-only root
    # Probes: /healthz on the serving port.
    (port,) = container["ports"]
    assert port["containerPort"] == 8700
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/healthz"
        assert get["port"] in (8700, port["name"])
    env = {e["name"]: e for e in container["env"]}
    assert env["ORCHARD_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "orchard-api-key", "key": "api-key"}


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_orchestrator_spreads_over_nodes(name):
    template = orchestrator(render(name))["spec"]["template"]
    constraints = template["spec"]["topologySpreadConstraints"]
    keys = [c["topologyKey"] for c in constraints]
    assert len(keys) == len(set(keys)), f"duplicate spread constraints (a patch merged instead of replacing): {keys}"
    by_key = {c["topologyKey"]: c for c in constraints}
    hostname = by_key["kubernetes.io/hostname"]
    assert selects(hostname["labelSelector"], template["metadata"]["labels"])
    # A hard rule on GKE; elsewhere (one-node dev clusters) a preference.
    assert hostname["whenUnsatisfiable"] == ("DoNotSchedule" if name == "gke" else "ScheduleAnyway")


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_disruption_budget_and_services_select_the_orchestrator(name):
    docs = render(name)
    deployment = orchestrator(docs)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (pdb,) = find(docs, "PodDisruptionBudget")
    assert pdb["metadata"]["namespace"] == "orchard"
    assert pdb["spec"]["minAvailable"] == 1
    assert selects(pdb["spec"]["selector"], labels)
    # Nothing else in the namespace carries the orchestrator's labels (a PDB over redis would be wrong).
    for other in find(docs, "StatefulSet") + find(docs, "Deployment"):
        if other is not deployment:
            assert not selects(pdb["spec"]["selector"], other["spec"]["template"]["metadata"]["labels"])
    service, port = service_port(docs, "http://orchard-orchestrator.orchard.svc:8700")
    assert target_container_port(service, port, deployment) == 8700


# --- RBAC --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_rbac_is_least_privilege(name):
    docs = render(name)
    assert not find(docs, "ClusterRole") and not find(docs, "ClusterRoleBinding"), "nothing cluster-wide"
    (role,) = find(docs, "Role")
    assert role["metadata"]["namespace"] == "orchard-sandboxes"
    granted = set()
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs")
        granted |= set(itertools.product(rule["apiGroups"], rule["resources"], rule["verbs"]))
    assert granted == ROLE_RULES
    (binding,) = find(docs, "RoleBinding")
    assert binding["metadata"]["namespace"] == "orchard-sandboxes"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "orchard-orchestrator", "namespace": "orchard"}]
    one(docs, "ServiceAccount", "orchard-orchestrator", "orchard")
    sandbox = one(docs, "ServiceAccount", "orchard-sandbox", "orchard-sandboxes")
    assert sandbox["automountServiceAccountToken"] is False


# --- network policies --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_sandbox_namespace_denies_by_default(name):
    docs = render(name)
    namespace = backend_config(docs)["namespace"]
    deny = [p for p in find(docs, "NetworkPolicy", namespace=namespace) if p["spec"]["podSelector"] == {}]
    assert len(deny) == 1, "one policy selecting every pod of the sandbox namespace"
    spec = deny[0]["spec"]
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert not spec.get("ingress") and not spec.get("egress"), "default deny has no allow rules"
    # Nothing else in that namespace allows traffic: per-sandbox allows come from the backend.
    assert find(docs, "NetworkPolicy", namespace=namespace) == deny


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_orchestrator_egress_reaches_agents_redis_and_dns(name):
    docs = render(name)
    config = backend_config(docs)
    policy = one(docs, "NetworkPolicy", "orchard-orchestrator", "orchard")
    labels = orchestrator(docs)["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["spec"]["podSelector"], labels)
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    egress = policy["spec"]["egress"]

    def allows(predicate, port: int, protocol: str = "TCP") -> bool:
        return any(any(predicate(peer) for peer in rule.get("to", []))
                   and any(p["port"] == port and p.get("protocol", "TCP") == protocol for p in rule["ports"])
                   for rule in egress)

    sandbox_ns = {"kubernetes.io/metadata.name": config["namespace"]}
    assert allows(lambda peer: peer.get("namespaceSelector", {}).get("matchLabels") == sandbox_ns,
                  config["agent_port"])
    redis = one(docs, "StatefulSet", "orchard-redis", "orchard")
    assert allows(lambda peer: "podSelector" in peer and "namespaceSelector" not in peer
                  and selects(peer["podSelector"], redis["spec"]["template"]["metadata"]["labels"]), 6379)
    assert allows(lambda peer: "namespaceSelector" in peer, 53, "UDP")
    assert allows(lambda peer: "ipBlock" in peer, 443)
    # Ingress: the API port only.
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [8700]
    # Redis accepts the orchestrators only.
    redis_policy = one(docs, "NetworkPolicy", "orchard-redis", "orchard")
    assert selects(redis_policy["spec"]["podSelector"], redis["spec"]["template"]["metadata"]["labels"])
    (rule,) = redis_policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert selects(peer["podSelector"], labels)


# --- the backend config ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_backend_config(name):
    docs = render(name)
    config = backend_config(docs)
    assert set(config) == BACKEND_KEYS
    options = KubernetesOptions.from_dict(config)  # what the orchestrator will make of it
    assert options.service_account == one(docs, "ServiceAccount", "orchard-sandbox")["metadata"]["name"]
    assert options.default_image == config["images"]["swe-base"]
    assert config["namespace"] == "orchard-sandboxes"
    one(docs, "Namespace", config["namespace"])
    deployment = orchestrator(docs)
    assert config["orchestrator_namespace"] == deployment["metadata"]["namespace"]
    assert config["orchestrator_labels"] == ORCHESTRATOR
    assert selects({"matchLabels": config["orchestrator_labels"]}, deployment["spec"]["template"]["metadata"]["labels"])
    assert config["agent_port"] == 8701
    assert isinstance(config["node_selector"], dict) and isinstance(config["images"], dict)
    assert isinstance(config["tolerations"], list) and isinstance(config["image_pull_secrets"], list)
    assert "swe-base" in config["images"]
    if name != "gke":
        assert config["runtime_class"] is None and config["priority_class"] is None
        assert config["node_selector"] == {} and config["tolerations"] == []


def test_gke_backend_runs_sandboxes_under_gvisor_on_spot_nodes():
    docs = render("gke")
    config = backend_config(docs)
    assert config["runtime_class"] == "gvisor"
    assert config["node_selector"] == {"cloud.google.com/gke-spot": "true", "orchard.dev/pool": "sandboxes"}
    assert {"key": "orchard.dev/pool", "operator": "Equal", "value": "sandboxes", "effect": "NoSchedule"} \
        in config["tolerations"]
    priority = one(docs, "PriorityClass", config["priority_class"])
    assert priority["preemptionPolicy"] == "Never"
    assert not priority.get("globalDefault")
    # Below the default priority (0), but not below the cluster autoscaler's expendable cutoff (-10):
    # lower than that, pending sandboxes would never scale the spot pool up.
    assert -10 <= priority["value"] < 0
    # Every toleration is well formed (the backend copies them into pod specs).
    for toleration in config["tolerations"]:
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
                 "spec": {"containers": [{"name": "c", "image": "busybox:1.36.1-musl"}],
                          "tolerations": [toleration], "nodeSelector": config["node_selector"],
                          "runtimeClassName": config["runtime_class"],
                          "priorityClassName": config["priority_class"]}}
        assert not (errors := validation_errors([probe])), errors


def test_gke_places_the_orchestrator_and_redis_on_the_system_pool():
    docs = render("gke")
    for workload in (orchestrator(docs), one(docs, "StatefulSet", "orchard-redis", "orchard")):
        assert workload["spec"]["template"]["spec"]["nodeSelector"] == {"orchard.dev/pool": "system"}


# --- api key -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_api_key_secret(name):
    docs = render(name)
    secrets = find(docs, "Secret")
    if name != "dev":
        assert secrets == [], f"the {name} kustomization must not carry an API key; users create orchard-api-key"
        return
    (secret,) = secrets
    assert secret["metadata"]["name"] == "orchard-api-key" and secret["metadata"]["namespace"] == "orchard"
    key = base64.b64decode(secret["data"]["api-key"]).decode()
    assert "dev" in key and "insecure" in key, "the dev key must look like what it is"


# --- redis -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_redis(name):
    docs = render(name)
    redis = one(docs, "StatefulSet", "orchard-redis", "orchard")
    assert redis["spec"]["replicas"] == 1
    assert redis["spec"]["serviceName"] == "orchard-redis"
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    repository, tag = split_image(container["image"])
    assert repository == "redis" and tag.startswith("7.") and tag.endswith("-alpine")
    args = container.get("command", []) + container.get("args", [])
    assert args[args.index("--appendonly") + 1] == "yes"
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/data"
    assert claim["spec"].get("storageClassName") == ("premium-rwo" if name == "gke" else None)
    service = one(docs, "Service", "orchard-redis", "orchard")
    assert service["spec"]["clusterIP"] == "None"
    # The orchestrator's --store URL names this Service and port.
    args = orchestrator(docs)["spec"]["template"]["spec"]["containers"][0]["args"]
    store = urlparse(args[args.index("--store") + 1])
    assert store.hostname == "orchard-redis"
    (port,) = service["spec"]["ports"]
    assert port["port"] == store.port == 6379
    assert target_container_port(service, port, redis) == 6379


# --- every workload ----------------------------------------------------------------------------------


def all_sources() -> list[tuple[str, list[dict]]]:
    return [*((f"kustomize:{n}", render(n)) for n in sorted(KUSTOMIZATIONS)),
            *((f"manifests/{p.name}", load(p)) for p in GKE_MANIFESTS)]


def test_every_container_has_limits():
    checked = 0
    for source, docs in all_sources():
        for doc in docs:
            for container in containers(doc):
                limits = container.get("resources", {}).get("limits", {})
                assert {"cpu", "memory"} <= set(limits), \
                    f"{source}: {doc['kind']} {doc['metadata']['name']}, container {container['name']}: limits {limits}"
                checked += 1
    assert checked >= 8


def test_images_are_pinned():
    for source, docs in all_sources():
        for image in all_images(docs):
            _, tag = split_image(image)
            assert tag is not None and tag != "latest", f"{source}: unpinned image {image}"
            # A version or digest everywhere; the dev overlay's own images are the locally built `dev`.
            if not (source == "kustomize:dev" and tag == "dev"):
                assert re.search(r"\d", tag), f"{source}: unpinned image {image}"


def test_dev_images_are_tagged_dev():
    images = [i for i in all_images(render("dev")) if "orchard-ai/" in i]
    assert len(images) >= 3
    assert all(split_image(i)[1] == "dev" for i in images), images


def test_gke_images_come_from_artifact_registry():
    images = all_images(render("gke"))
    for path in GKE_MANIFESTS:
        images += all_images(load(path))
    ours = [i for i in images if not i.startswith("redis:")]
    assert len(ours) >= 5
    assert all(i.startswith(GKE_REGISTRY) for i in ours), ours
    # Each has a Dockerfile whose header says how to build exactly that repository.
    headers = "\n".join(p.read_text() for p in DOCKERFILES)
    for image in ours:
        repository = split_image(image)[0].removeprefix(GKE_REGISTRY)
        assert re.search(rf"-t \S*/{re.escape(repository)}:", headers) or \
            re.search(rf"-t \S*{re.escape(repository)}:", headers), f"no Dockerfile builds {repository}"


# --- the recipe's view of the cluster ---------------------------------------------------------------


def test_recipe_addresses_match_the_manifests():
    """configs/swe_bar.py:qwen3_30b_a3b reaches Orchard Env and vLLM at Services that exist."""
    config = recipe_config()
    gke = render("gke")
    vllm_docs = load(INFRA / "gke/manifests/vllm.yaml")
    # Orchard Env.
    service, port = service_port(gke, config.env.url)
    assert target_container_port(service, port, orchestrator(gke)) == 8700
    assert config.env.backend == "kubernetes"
    # vLLM: URL, served name, and the weights directory it loads and reloads.
    assert urlparse(config.rl.engine.url).path == "/v1"
    vllm = one(vllm_docs, "Deployment", "vllm", "orchard")
    service, port = service_port(vllm_docs, config.rl.engine.url)
    (container,) = vllm["spec"]["template"]["spec"]["containers"]
    assert target_container_port(service, port, vllm) == 8000
    argv = container["command"] + container["args"]
    assert f"--served-model-name={config.rl.engine.served_model}" in argv
    assert argv[:3] == ["vllm", "serve", config.rl.engine.weights_dir]
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in container["env"]
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    # The learners write where vLLM reads: the same claim and subPath behind weights_dir's parent.

    def weights_source(spec: dict, container: dict) -> tuple[str, str]:
        volumes = {v["name"]: v for v in spec["volumes"]}
        for mount in container["volumeMounts"]:
            if config.rl.engine.weights_dir.startswith(mount["mountPath"].rstrip("/") + "/"):
                return volumes[mount["name"]]["persistentVolumeClaim"]["claimName"], mount.get("subPath", "")
        raise AssertionError(f"{container['name']} does not mount {config.rl.engine.weights_dir}")

    shared = weights_source(vllm["spec"]["template"]["spec"], container)
    claim = one(vllm_docs, "PersistentVolumeClaim", shared[0], "orchard")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert config.env.api_key == ""
    for path in (TPU_LEARNER, GPU_LEARNER):  # the TPU slice's learner and the GPU hosts' alike
        learner_spec = pod_spec(one(load(path), "JobSet", load(path)[0]["metadata"]["name"], "orchard"))
        (learner,) = learner_spec["containers"]
        assert shared == weights_source(learner_spec, learner), path.name
        # The learner gets the API key the recipe reads when config.env.api_key is empty.
        env = {e["name"]: e for e in learner["env"]}
        assert env["ORCHARD_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "orchard-api-key", "key": "api-key"}
        assert "--config=/app/configs/swe_bar.py:qwen3_30b_a3b" in learner["args"]


def test_learner_slice_matches_the_mesh_and_the_pool():
    config = recipe_config()
    chips = config.mesh.fsdp * config.mesh.tp * config.mesh.ep
    jobset, replicated, job, learner = learner_job(TPU_LEARNER)
    assert jobset["metadata"]["name"] == "orchard-learner"
    assert job["parallelism"] == job["completions"]
    assert job["completionMode"] == "Indexed"
    spec = job["template"]["spec"]
    per_host = int(learner["resources"]["limits"]["google.com/tpu"])
    assert learner["resources"]["requests"]["google.com/tpu"] == learner["resources"]["limits"]["google.com/tpu"]
    assert replicated["replicas"] * job["parallelism"] * per_host == chips
    topology = spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
    assert math.prod(int(d) for d in topology.split("x")) == chips
    # TPU v5p (95 GiB a chip): the GKE label, machine type and 3-D topology of a v5p slice.
    assert spec["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5p-slice"
    assert config.mesh.device == "tpu-v5p" and DEVICE_MEMORY["tpu-v5p"] == 95 << 30
    assert len(topology.split("x")) == 3
    # create-cluster.sh makes that slice.
    pool = node_pool(script_commands(INFRA / "gke/create-cluster.sh"), "tpu")
    assert pool["--tpu-topology"] == [topology]
    assert pool["--machine-type"] == ["ct5p-hightpu-4t"]  # v5p, 4 chips per host
    assert int(pool["--num-nodes"][0]) == job["parallelism"] and per_host == 4


@pytest.mark.parametrize("named", SLICE_VARIANTS)
def test_every_paper_variant_fills_the_learner_slice(named):
    """Each large variant's mesh is the slice's chips, on the slice's device, so the same JobSet runs it."""
    config = recipe_config(named)
    _, replicated, job, learner = learner_job(TPU_LEARNER)
    chips = replicated["replicas"] * job["parallelism"] * int(learner["resources"]["limits"]["google.com/tpu"])
    assert (config.mesh.fsdp * config.mesh.tp * config.mesh.ep, config.mesh.device) == (chips, "tpu-v5p")


def test_tpu_learner_joins_by_detection():
    """On the slice, JAX finds its peers itself (orchard.distributed: TPU_WORKER_HOSTNAMES from GKE's TPU
    webhook, which needs an Indexed Job whose pods have DNS hostnames); no explicit settings override it."""
    jobset, replicated, job, learner = learner_job(TPU_LEARNER)
    names = {e["name"] for e in learner.get("env", [])}
    assert not names & {COORDINATOR_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV}, names
    hosts = int(node_pool(script_commands(INFRA / "gke/create-cluster.sh"), "tpu")["--num-nodes"][0])
    assert replicated["replicas"] == 1
    assert job["completionMode"] == "Indexed" and job["parallelism"] == job["completions"] == hosts
    assert jobset["spec"]["network"]["enableDNSHostnames"] is True
    # The coordinator port JAX's GKE TPU detection uses (a private constant: checked when it is there).
    try:
        from jax._src.clusters.cloud_tpu_cluster import coordinator_port
    except ImportError:
        coordinator_port = None
    if coordinator_port is not None:
        assert container_port(learner, "jax-coord") == int(coordinator_port)


def test_gpu_learner_sets_the_explicit_settings():
    """On GPU hosts the manifest names the coordinator: process 0's JobSet hostname and the port it
    exposes, the process count = the Job's pods; each pod's id is its completion index."""
    jobset, replicated, job, learner = learner_job(GPU_LEARNER)
    env = {e["name"]: e["value"] for e in learner["env"] if "value" in e}
    assert PROCESS_ID_ENV not in env, "the id is each pod's own: JOB_COMPLETION_INDEX"
    assert job["completionMode"] == "Indexed" and replicated["replicas"] == 1
    hosts = job["parallelism"]
    assert job["completions"] == hosts == int(env[NUM_PROCESSES_ENV])
    # <jobset>-<replicatedJob>-<job index>-<pod index>.<subdomain>, the subdomain defaulting to the JobSet's name.
    network = jobset["spec"]["network"]
    assert network["enableDNSHostnames"] is True
    name = jobset["metadata"]["name"]
    host, _, port = env[COORDINATOR_ENV].rpartition(":")
    assert host == f"{name}-{replicated['name']}-0-0.{network.get('subdomain', name)}"
    assert int(port) == container_port(learner, "jax-coord")
    # orchard.distributed accepts what the first and the last pod get, and refuses an index past the count.
    first = ProcessGroup.from_env({**env, INDEXED_JOB_ENV: "0"})
    last = ProcessGroup.from_env({**env, INDEXED_JOB_ENV: str(hosts - 1)})
    assert first == ProcessGroup(env[COORDINATOR_ENV], hosts, 0)
    assert last == ProcessGroup(env[COORDINATOR_ENV], hosts, hosts - 1)
    with pytest.raises(ValueError):
        ProcessGroup.from_env({**env, INDEXED_JOB_ENV: str(hosts)})
    # The mesh of the config it runs, on these GPUs: hosts x GPUs a host, on a device the plan knows.
    per_host = int(learner["resources"]["limits"]["nvidia.com/gpu"])
    assert learner["resources"]["requests"]["nvidia.com/gpu"] == str(per_host) and per_host == 8
    args = dict(a.removeprefix("--").split("=", 1) for a in learner["args"])
    config = recipe_config(args["config"].removeprefix("/app/configs/"))
    assert config.mesh.fsdp * config.mesh.tp * config.mesh.ep == hosts * per_host
    assert args["config.mesh.device"] in DEVICE_MEMORY and args["config.mesh.device"].startswith("h")
    # create-cluster.sh makes those hosts when asked (GPU_LEARNER_NODES), and only then.
    assert not [c for c in script_commands(INFRA / "gke/create-cluster.sh") if "gpu-learner" in c]
    pool = node_pool(script_commands(INFRA / "gke/create-cluster.sh", GPU_LEARNER_NODES=str(hosts)), "gpu-learner")
    accelerator = dict(part.split("=", 1) for part in pool["--accelerator"][0].split(","))
    selector = job["template"]["spec"]["nodeSelector"]
    assert accelerator["type"] == selector["cloud.google.com/gke-accelerator"]
    assert int(accelerator["count"]) == per_host and int(pool["--num-nodes"][0]) == hosts
    assert [f"orchard.dev/pool={selector['orchard.dev/pool']}"] == pool["--node-labels"]
    # vLLM's pool has the same GPUs and taint: vLLM selects its own pool, not the learner's.
    vllm = one(load(INFRA / "gke/manifests/vllm.yaml"), "Deployment", "vllm")
    assert vllm["spec"]["template"]["spec"]["nodeSelector"]["orchard.dev/pool"] != selector["orchard.dev/pool"]


# --- the cluster scripts -----------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_syntax(script):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    assert os.access(script, os.X_OK)


def test_create_cluster_pools_match_the_manifests():
    commands = script_commands(INFRA / "gke/create-cluster.sh")
    create = [c for c in commands if c[:4] == ["gcloud", "container", "clusters", "create"]]
    assert len(create) == 1
    cluster = flags(create[0])
    assert "--enable-dataplane-v2" in cluster, "NetworkPolicy enforcement"
    gke = render("gke")
    config = backend_config(gke)
    # The system pool carries the label the orchestrator and Redis select.
    system = orchestrator(gke)["spec"]["template"]["spec"]["nodeSelector"]
    assert [f"{k}={v}" for k, v in system.items()] == cluster["--node-labels"]
    # The sandbox pool: spot, gVisor, and the label and taint the backend config selects and tolerates.
    sandboxes = node_pool(commands, "sandboxes")
    assert "--spot" in sandboxes and sandboxes["--sandbox"] == ["type=gvisor"]
    assert "--enable-autoscaling" in sandboxes
    labels = dict(label.split("=", 1) for label in sandboxes["--node-labels"][0].split(","))
    assert {k: v for k, v in config["node_selector"].items() if k != "cloud.google.com/gke-spot"} == labels
    taints = [re.fullmatch(r"([^=]+)=([^:]+):(\w+)", t).groups() for t in sandboxes["--node-taints"][0].split(",")]
    tolerated = {(t["key"], t["value"], t["effect"]) for t in config["tolerations"]}
    assert set(taints) <= tolerated
    # The GPU pool: what vLLM selects, with as many GPUs as its tensor parallelism.
    vllm = one(load(INFRA / "gke/manifests/vllm.yaml"), "Deployment", "vllm")
    spec = vllm["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    gpu = node_pool(commands, "gpu")
    accelerator = dict(part.split("=", 1) for part in gpu["--accelerator"][0].split(","))
    assert accelerator["type"] == spec["nodeSelector"]["cloud.google.com/gke-accelerator"]
    tensor_parallel = next(int(a.split("=")[1]) for a in container["args"] if a.startswith("--tensor-parallel-size="))
    assert int(accelerator["count"]) == tensor_parallel == int(container["resources"]["limits"]["nvidia.com/gpu"])
    # JobSet is installed from a pinned release.
    (jobset,) = [c for c in commands if c[:2] == ["kubectl", "apply"]]
    assert re.search(r"/jobset/releases/download/v\d+\.\d+\.\d+/manifests\.yaml$", jobset[-1])


def test_delete_cluster_releases_volumes_before_the_cluster():
    commands = script_commands(INFRA / "gke/delete-cluster.sh")
    delete_cluster = next(i for i, c in enumerate(commands) if c[:4] == ["gcloud", "container", "clusters", "delete"])
    deleted = [c for c in commands[:delete_cluster] if c[0] == "kubectl" and "delete" in c]
    targets = " ".join(" ".join(c) for c in deleted)
    assert "vllm.yaml" in targets and "learner-jobset.yaml" in targets and "overlays/gke" in targets
    assert any("pvc" in c for c in deleted)
    assert not any(c[:4] == ["gcloud", "artifacts", "repositories", "delete"] for c in commands)


# --- Dockerfiles -------------------------------------------------------------------------------------


def dockerfile_stages(path: Path) -> list[str]:
    """The base image of each stage, with ARG defaults substituted."""
    text = path.read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.M))
    bases = re.findall(r"^FROM (\S+)", text, flags=re.M)
    return [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base) for base in bases]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile(path):
    text = path.read_text()
    assert text.startswith("# "), "a header comment says what the image is"
    assert f"docker build -f infra/images/{path.name} " in text and text.count(" .\n") >= 1, \
        "the header shows the build command, run from the repository root"
    for base in dockerfile_stages(path):
        _, tag = split_image(base)
        assert tag and tag != "latest" and re.search(r"\d", tag), f"unpinned base image {base}"
    ignore = path.with_name(path.name + ".dockerignore")
    assert ignore.exists(), "each Dockerfile filters its build context (the repository holds .venv and runs/)"
    assert ignore.read_text().splitlines()[1] == "*", "the context starts from nothing"
    users = re.findall(r"^USER (\S+)", text, flags=re.M)
    if path.name in ("orchestrator.Dockerfile", "swe-sandbox.Dockerfile", "agent-bundle.Dockerfile"):
        assert users and users[-1].split(":")[0] not in ("0", "root"), "runs as a non-root user"


def test_dockerfile_contracts():
    read = {p.name: p.read_text() for p in DOCKERFILES}
    assert set(read) == {"orchestrator.Dockerfile", "agent-bundle.Dockerfile", "swe-sandbox.Dockerfile",
                         "learner.Dockerfile", "vllm.Dockerfile"}
    assert 'ENTRYPOINT ["orchard", "env", "serve"]' in read["orchestrator.Dockerfile"]
    assert '".[env,redis,k8s]"' in read["orchestrator.Dockerfile"]
    bundle = read["agent-bundle.Dockerfile"]
    assert "orchard env bundle --out /out/bundle" in bundle
    assert "COPY --from=build /out/bundle /bundle" in bundle
    assert dockerfile_stages(INFRA / "images/agent-bundle.Dockerfile")[-1].startswith("busybox:")
    swe = read["swe-sandbox.Dockerfile"]
    assert "WORKDIR /workspace" in swe and "--uid 1000" in swe and "useradd" in swe
    learner = read["learner.Dockerfile"]
    assert "experiments/swe_bar/run.py" in learner and "COPY configs" in learner
    # The vLLM image tag and the manifest's agree.
    (vllm_base,) = dockerfile_stages(INFRA / "images/vllm.Dockerfile")
    vllm = one(load(INFRA / "gke/manifests/vllm.yaml"), "Deployment", "vllm")
    assert split_image(vllm_base)[1] == split_image(vllm["spec"]["template"]["spec"]["containers"][0]["image"])[1]
    # Every path the Dockerfiles COPY from the context is let through their .dockerignore.
    for name, text in read.items():
        allowed = (INFRA / "images" / f"{name}.dockerignore").read_text()
        for sources in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.M):
            for source in sources.split():
                assert f"!{source.rstrip('/')}" in allowed, f"{name} copies {source}, which its .dockerignore drops"
