# The rollout server: vLLM's OpenAI-compatible server, unchanged, run by
# infra/gke/manifests/vllm.yaml on the GPU pool. The tag matches the vllm release on PyPI the
# manifests were written against; bump both together.
#
# Build from the repository root (only to mirror it into Artifact Registry; the stock image works):
#   docker build -f infra/images/vllm.Dockerfile -t us-docker.pkg.dev/PROJECT_ID/orchard/vllm-openai:v0.33.0 .
#
# Health: GET /health on port 8000 (the readiness probe in vllm.yaml). The learner's weight sync
# (orchard.rollout.openai_engine.ReloadFromDisk) calls POST /collective_rpc {"method": "reload_weights"},
# a dev-mode route, hence VLLM_SERVER_DEV_MODE=1; keep the server reachable only inside the cluster.
FROM vllm/vllm-openai:v0.33.0
ENV VLLM_SERVER_DEV_MODE=1
