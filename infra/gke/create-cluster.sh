#!/usr/bin/env bash
# Create the GKE cluster Orchard runs on, with four node pools (and an optional fifth):
#   default-pool  system: the orchestrator, Redis, controllers (label orchard.dev/pool=system)
#   sandboxes     autoscaling Spot CPU nodes under GKE Sandbox (gVisor), tainted and labelled
#                 orchard.dev/pool=sandboxes: only sandbox pods (infra/k8s/overlays/gke) land there
#   gpu           the vLLM rollout server (infra/gke/manifests/vllm.yaml)
#   tpu           one multi-host TPU v5p slice for the JAX learner JobSet (infra/gke/manifests/learner-jobset.yaml)
#   gpu-learner   only with GPU_LEARNER_NODES > 0: GPU hosts for the learner instead of the slice
#                 (infra/gke/manifests/learner-jobset-gpu.yaml)
# then installs the JobSet controller and creates the Artifact Registry repository for the images.
#
#   PROJECT_ID=my-project infra/gke/create-cluster.sh
#   DRY_RUN=1 PROJECT_ID=my-project infra/gke/create-cluster.sh    # print the commands, run nothing
#
# Every setting below can be overridden from the environment. No secrets are created here: the API
# key Secret is made by hand (infra/gke/README.md). Check accelerator availability in your zones
# first: gcloud compute accelerator-types list --filter="zone:($GPU_ZONE)"; TPU v5p zones are listed
# in the Cloud TPU documentation (https://cloud.google.com/tpu/docs/regions-zones); TPU_ZONE must be
# in REGION.
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

# The learner's slice: TPU v5p, 95 GiB of HBM a chip (a v5e's 16 GiB cannot hold one 64K-token row of
# Qwen3-30B-A3B: orchard.train.plan, --dry-run). 4x4x4 is one full v5p cube: 64 chips on 16 hosts of 4,
# machine type ct5p-hightpu-4t (208 vCPUs, 448 GB a host), node label
# cloud.google.com/gke-tpu-accelerator=tpu-v5p-slice (https://cloud.google.com/tpu/docs/v5p, the
# configurations table; https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus). 64 chips =
# the mesh of configs/swe_bar.py:qwen3_30b_a3b, fsdp 16 x tp 2 x ep 2 (and of swe_sft, claw_grpo, gui_grpo).
# learner-jobset.yaml must agree (parallelism, google.com/tpu, topology); tests/infra checks it.
TPU_ZONE="${TPU_ZONE:-us-central1-a}"                 # v5p: us-central1-a, us-east5-a (regions-zones page)
TPU_MACHINE="${TPU_MACHINE:-ct5p-hightpu-4t}"
TPU_TOPOLOGY="${TPU_TOPOLOGY:-4x4x4}"
TPU_CHIPS_PER_HOST="${TPU_CHIPS_PER_HOST:-4}"
TPU_EXTRA_FLAGS="${TPU_EXTRA_FLAGS:-}"                # e.g. "--spot" or "--reservation-affinity=specific --reservation=NAME"

# Optional GPU hosts for the learner (learner-jobset-gpu.yaml), 0: none. 8 hosts x 8 H100 = 64 GPUs, the
# same mesh with --config.mesh.device=h100 (about 28 GiB of 80 a GPU).
GPU_LEARNER_NODES="${GPU_LEARNER_NODES:-0}"
GPU_LEARNER_ZONE="${GPU_LEARNER_ZONE:-$GPU_ZONE}"
GPU_LEARNER_MACHINE="${GPU_LEARNER_MACHINE:-a3-highgpu-8g}"
GPU_LEARNER_TYPE="${GPU_LEARNER_TYPE:-nvidia-h100-80gb}"
GPU_LEARNER_COUNT="${GPU_LEARNER_COUNT:-8}"

JOBSET_VERSION="${JOBSET_VERSION:-v0.12.0}"
DRY_RUN="${DRY_RUN:-0}"

# shellcheck source=infra/gke/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"  # run: prints instead under DRY_RUN=1

tpu_hosts="$(slice_hosts "$TPU_TOPOLOGY" "$TPU_CHIPS_PER_HOST")"

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

# Only when asked for: GPU hosts for the learner, labelled apart from vLLM's pool (both carry the GPU taint).
if (( GPU_LEARNER_NODES > 0 )); then
  run gcloud container node-pools create gpu-learner \
    --project "$PROJECT_ID" --region "$REGION" --cluster "$CLUSTER" \
    --node-locations "$GPU_LEARNER_ZONE" \
    --machine-type "$GPU_LEARNER_MACHINE" \
    --accelerator "type=$GPU_LEARNER_TYPE,count=$GPU_LEARNER_COUNT,gpu-driver-version=latest" \
    --num-nodes "$GPU_LEARNER_NODES" \
    --node-labels orchard.dev/pool=gpu-learner \
    --node-taints nvidia.com/gpu=present:NoSchedule
fi

run gcloud container clusters get-credentials "$CLUSTER" --project "$PROJECT_ID" --region "$REGION"

# JobSet runs the learner (one Job per slice, one pod per TPU host).
run kubectl apply --server-side \
  -f "https://github.com/kubernetes-sigs/jobset/releases/download/${JOBSET_VERSION}/manifests.yaml"
run kubectl -n jobset-system wait --for=condition=Available --timeout=300s \
  deployment/jobset-controller-manager

echo "cluster $CLUSTER is ready; next: build and push the images (infra/gke/README.md, step 2)"
