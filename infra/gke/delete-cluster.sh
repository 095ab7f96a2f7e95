#!/usr/bin/env bash
# Delete what create-cluster.sh made. Workloads go first, so that their volumes (the Redis disk,
# the Filestore share behind orchard-shared) are released by Kubernetes instead of being orphaned.
# That includes the orchard-shared volume: weights, checkpoints and run directories on it are gone
# afterwards, so copy out what you want to keep first. The Artifact Registry repository is kept
# unless DELETE_IMAGES=1.
#
#   PROJECT_ID=my-project infra/gke/delete-cluster.sh           # asks before deleting
#   YES=1 PROJECT_ID=my-project infra/gke/delete-cluster.sh     # no question
#   DRY_RUN=1 PROJECT_ID=my-project infra/gke/delete-cluster.sh # print the commands, run nothing
set -euo pipefail

PROJECT_ID="${PROJECT_ID:?set PROJECT_ID to your Google Cloud project}"
CLUSTER="${CLUSTER:-orchard}"
REGION="${REGION:-us-central1}"
AR_LOCATION="${AR_LOCATION:-us}"
AR_REPOSITORY="${AR_REPOSITORY:-orchard}"
DELETE_IMAGES="${DELETE_IMAGES:-0}"
YES="${YES:-0}"
DRY_RUN="${DRY_RUN:-0}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# shellcheck source=infra/gke/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"  # run: prints instead under DRY_RUN=1

if [[ "$YES" != 1 && "$DRY_RUN" != 1 ]]; then
  read -r -p "Delete cluster $CLUSTER in $PROJECT_ID/$REGION and everything on it? [y/N] " answer
  [[ "$answer" == y || "$answer" == Y ]] || { echo "nothing deleted"; exit 1; }
fi

if [[ "$DRY_RUN" == 1 ]] || gcloud container clusters get-credentials "$CLUSTER" \
    --project "$PROJECT_ID" --region "$REGION" >/dev/null 2>&1; then
  run kubectl delete --ignore-not-found -f "$here/manifests/learner-jobset.yaml"
  run kubectl delete --ignore-not-found -f "$here/manifests/learner-jobset-gpu.yaml"
  run kubectl delete --ignore-not-found -f "$here/manifests/vllm.yaml"
  run kubectl delete --ignore-not-found -k "$here/../k8s/overlays/gke"
  # StatefulSet claims outlive their pods: release the Redis disk explicitly.
  run kubectl -n orchard delete pvc --ignore-not-found -l app.kubernetes.io/name=orchard-redis
fi

run gcloud container clusters delete "$CLUSTER" --project "$PROJECT_ID" --region "$REGION" --quiet

if [[ "$DELETE_IMAGES" == 1 ]]; then
  run gcloud artifacts repositories delete "$AR_REPOSITORY" --project "$PROJECT_ID" \
    --location "$AR_LOCATION" --quiet
fi
