#!/usr/bin/env bash
# Create the GKE cluster Orchard runs on, with four node pools:
#   default-pool  system: the orchestrator, Redis, controllers (label orchard.dev/pool=system)
#   sandboxes     autoscaling Spot CPU nodes under GKE Sandbox (gVisor), tainted and labelled
#                 orchard.dev/pool=sandboxes: only sandbox pods (infra/k8s/overlays/gke) land there
#   gpu           the vLLM rollout server (infra/gke/manifests/vllm.yaml)
#   tpu           one multi-host TPU slice for the JAX learner JobSet (infra/gke/manifests/learner-jobset.yaml)
# then installs the JobSet controller and creates the Artifact Registry repository for the images.
#
#   PROJECT_ID=my-project infra/gke/create-cluster.sh
#   DRY_RUN=1 PROJECT_ID=my-project infra/gke/create-cluster.sh    # print the commands, run nothing
#
# Every setting below can be overridden from the environment. No secrets are created here: the API
# key Secret is made by hand (infra/gke/README.md). Check accelerator availability in your zones
# first: gcloud compute accelerator-types list --filter="zone:($GPU_ZONE)"; TPU v5e zones are listed
# in the Cloud TPU documentation.
set -euo pipefail

PROJECT_ID="${PROJECT_ID:?set PROJECT_ID to your Google Cloud project}"
CLUSTER="${CLUSTER:-orchard}"
REGION="${REGION:-us-central1}"
RELEASE_CHANNEL="${RELEASE_CHANNEL:-regular}"
AR_LOCATION="${AR_LOCATION:-us}"             # images: ${AR_LOCATION}-docker.pkg.dev/$PROJECT_ID/orchard/...
AR_REPOSITORY="${AR_REPOSITORY:-orchard}"

SYSTEM_MACHINE="${SYSTEM_MACHINE:-e2-standard-8}"
SYSTEM_NODES_PER_ZONE="${SYSTEM_NODES_PER_ZONE:-1}"   # regional: one per zone, so 2 orchestrators spread

SANDBOX_MACHINE="${SANDBOX_MACHINE:-n2-standard-32}"
SANDBOX_MAX_NODES="${SANDBOX_MAX_NODES:-50}"          # total across zones; the pool scales from 0

GPU_ZONE="${GPU_ZONE:-us-central1-a}"
GPU_MACHINE="${GPU_MACHINE:-a3-highgpu-8g}"
GPU_TYPE="${GPU_TYPE:-nvidia-h100-80gb}"
GPU_COUNT="${GPU_COUNT:-8}"                           # = vLLM --tensor-parallel-size in vllm.yaml

# The learner's slice: fsdp x tp of configs/swe_bar.py:qwen3_30b_a3b (32 x 4 = 128 chips) = 8x16 v5e,
# 32 hosts of 4 chips. learner-jobset.yaml must agree (parallelism, google.com/tpu, topology).
TPU_ZONE="${TPU_ZONE:-us-central1-a}"
TPU_MACHINE="${TPU_MACHINE:-ct5lp-hightpu-4t}"
TPU_TOPOLOGY="${TPU_TOPOLOGY:-8x16}"
TPU_CHIPS_PER_HOST="${TPU_CHIPS_PER_HOST:-4}"
TPU_EXTRA_FLAGS="${TPU_EXTRA_FLAGS:-}"                # e.g. "--spot" or "--reservation-affinity=specific --reservation=NAME"

JOBSET_VERSION="${JOBSET_VERSION:-v0.12.0}"
DRY_RUN="${DRY_RUN:-0}"

# shellcheck source=infra/gke/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"  # run: prints instead under DRY_RUN=1

# Hosts in the slice: the product of the topology's dimensions over chips per host.
tpu_chips=1
IFS=x read -r -a tpu_dims <<< "$TPU_TOPOLOGY"
for dim in "${tpu_dims[@]}"; do
  tpu_chips=$((tpu_chips * dim))
done
tpu_hosts=$((tpu_chips / TPU_CHIPS_PER_HOST))

run gcloud services enable container.googleapis.com artifactregistry.googleapis.com file.googleapis.com \
  --project "$PROJECT_ID"

if [[ "$DRY_RUN" == 1 ]] || ! gcloud artifacts repositories describe "$AR_REPOSITORY" \
    --project "$PROJECT_ID" --location "$AR_LOCATION" >/dev/null 2>&1; then
  run gcloud artifacts repositories create "$AR_REPOSITORY" --project "$PROJECT_ID" \
    --location "$AR_LOCATION" --repository-format docker --description "Orchard images"
fi

# Dataplane V2 enforces NetworkPolicy (the sandboxes' default deny depends on it); Workload Identity
# and the Filestore / GCS FUSE CSI drivers serve the shared weights volume.
run gcloud container clusters create "$CLUSTER" \
  --project "$PROJECT_ID" --region "$REGION" \
  --release-channel "$RELEASE_CHANNEL" \
  --enable-dataplane-v2 --enable-ip-alias \
  --workload-pool "$PROJECT_ID.svc.id.goog" \
  --addons GcpFilestoreCsiDriver,GcsFuseCsiDriver \
  --enable-shielded-nodes \
  --machine-type "$SYSTEM_MACHINE" --num-nodes "$SYSTEM_NODES_PER_ZONE" \
  --node-labels orchard.dev/pool=system

run gcloud container node-pools create sandboxes \
  --project "$PROJECT_ID" --region "$REGION" --cluster "$CLUSTER" \
  --machine-type "$SANDBOX_MACHINE" --image-type COS_CONTAINERD \
  --spot --sandbox type=gvisor \
  --enable-autoscaling --total-min-nodes 0 --total-max-nodes "$SANDBOX_MAX_NODES" --num-nodes 0 \
  --node-labels orchard.dev/pool=sandboxes \
  --node-taints orchard.dev/pool=sandboxes:NoSchedule

run gcloud container node-pools create gpu \
  --project "$PROJECT_ID" --region "$REGION" --cluster "$CLUSTER" \
  --node-locations "$GPU_ZONE" \
  --machine-type "$GPU_MACHINE" \
  --accelerator "type=$GPU_TYPE,count=$GPU_COUNT,gpu-driver-version=latest" \
  --enable-autoscaling --min-nodes 0 --max-nodes 1 --num-nodes 1 \
  --node-labels orchard.dev/pool=gpu \
  --node-taints nvidia.com/gpu=present:NoSchedule

# A multi-host slice pool has exactly one slice: num-nodes = hosts, no autoscaling.
# shellcheck disable=SC2086  # TPU_EXTRA_FLAGS is a list of flags
run gcloud container node-pools create tpu \
  --project "$PROJECT_ID" --region "$REGION" --cluster "$CLUSTER" \
  --node-locations "$TPU_ZONE" \
  --machine-type "$TPU_MACHINE" --tpu-topology "$TPU_TOPOLOGY" --num-nodes "$tpu_hosts" \
  --node-labels orchard.dev/pool=tpu \
  $TPU_EXTRA_FLAGS

run gcloud container clusters get-credentials "$CLUSTER" --project "$PROJECT_ID" --region "$REGION"

# JobSet runs the learner (one Job per slice, one pod per TPU host).
run kubectl apply --server-side \
  -f "https://github.com/kubernetes-sigs/jobset/releases/download/${JOBSET_VERSION}/manifests.yaml"
run kubectl -n jobset-system wait --for=condition=Available --timeout=300s \
  deployment/jobset-controller-manager

echo "cluster $CLUSTER is ready; next: build and push the images (infra/gke/README.md, step 2)"
