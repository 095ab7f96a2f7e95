# Shared by the cluster scripts (sourced, not run).

# Run a command, or with DRY_RUN=1 print it, quoted, instead.
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

# The hosts of a TPU slice: the product of its topology's dimensions (4x4x4: 64 chips) over chips per host.
slice_hosts() {
  local topology="$1" per_host="$2" chips=1 dim
  local -a dims
  IFS=x read -r -a dims <<< "$topology"
  for dim in "${dims[@]}"; do
    chips=$((chips * dim))
  done
  if (( chips % per_host )); then
    echo "topology $topology ($chips chips) is not whole hosts of $per_host chips" >&2
    return 1
  fi
  echo $((chips / per_host))
}
