#!/usr/bin/env bash
# Puts back, one at a time, each defect that a review found in the allocation invariants
# (hack/mutations/*.patch) and runs the end-to-end test written for it: every test must FAIL
# with its defect in place. The working tree is restored after each patch. Prints a table.
#   hack/mutations.sh            every patch
#   hack/mutations.sh NAME...    the named ones (file names without .patch)
# Each patch starts with "# test: <cargo test target> <test name>" before the diff; a patch
# marked "# simulator" is also put back by hack/simulate.sh --mutations.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$NODEIPAM_ROOT"
claim_target
git diff --quiet HEAD -- . || die "the working tree has changes: commit or stash them first (mutations patch it)"
timed "control-plane binaries" "$NODEIPAM_ROOT/hack/control-plane.sh" build

names=("$@")
if [[ ${#names[@]} -eq 0 ]]; then
  # Those without an end-to-end test are the simulator's (hack/simulate.sh --mutations).
  for p in hack/mutations/*.patch; do
    grep -q '^# test: ' "$p" && names+=("$(basename "$p" .patch)")
  done
fi
restore() { git checkout --quiet HEAD -- alloc controller crd webhook tests config; }
trap restore EXIT
results=()
for name in "${names[@]}"; do
  patch="hack/mutations/$name.patch"
  [[ -f "$patch" ]] || die "no such mutation: $patch"
  read -r target test < <(sed -n 's/^# test: //p' "$patch" | head -1)
  [[ -n "${test:-}" ]] || die "$patch has no '# test: <target> <name>' line"
  git apply "$patch" || die "$patch no longer applies"
  start=$SECONDS
  log "mutation $name: running $target::$test"
  # The binary too: the deploy tests run `nodeipam` as a process.
  if ! { cargo build --quiet --locked -p nodeipam-controller --bin nodeipam &&
      cargo test --quiet --locked -p nodeipam-testenv --test "$target" --no-run; } \
      >"$NODEIPAM_CACHE/mutation-$name.log" 2>&1; then
    verdict="DOES NOT BUILD (see $NODEIPAM_CACHE/mutation-$name.log)"
  elif cargo test --quiet --locked -p nodeipam-testenv --test "$target" -- --exact "$test" \
      >>"$NODEIPAM_CACHE/mutation-$name.log" 2>&1; then
    verdict="SURVIVED (the test passed with the defect in place)"
  else
    verdict="caught"
  fi
  results+=("$(printf '%-32s %-10s %4ss  %s' "$name" "$target" "$((SECONDS - start))" "$verdict")")
  restore
done
printf '%s\n' "mutation                         target      time  verdict" "${results[@]}"
! printf '%s\n' "${results[@]}" | grep -q -e SURVIVED -e 'DOES NOT BUILD'
