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
