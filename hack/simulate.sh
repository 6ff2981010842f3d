#!/usr/bin/env bash
# The deterministic simulator of the allocation core (alloc/tests/simulator.rs), beyond
# the budget CI gives it.
#   hack/simulate.sh [SECONDS]            soak: seeds from a random start for SECONDS (600)
#   hack/simulate.sh --mutations [NAME…]  puts back each defect of hack/mutations/ marked
#       "# simulator", one at a time, and runs the simulator with CI's budget: every one must
#       be found. Prints a table (seeds and steps until the failure, the rule it broke).
#       A patch marked "# simulator leadership" is run against the leadership simulator
#       (alloc/tests/sim/leadership.rs) instead of the allocation one; "# simulator
#       leadership beyond" against its search with writes landing beyond the take-over wait.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$NODEIPAM_ROOT"
claim_target

# simulate [TEST]: one test of the simulator, the allocation one unless named.
simulate() {
  cargo test --quiet --locked -p nodeipam-alloc --test simulator -- \
    --exact "${1:-seeded_schedules_keep_every_invariant}" --nocapture
}

if [[ "${1:-}" != "--mutations" ]]; then
  seconds="${1:-600}"
  first=$(( (RANDOM << 15 | RANDOM) * 1000 ))
  log "simulating for ${seconds}s from seed $first"
  NODEIPAM_SIM_SECONDS="$seconds" NODEIPAM_SIM_FIRST_SEED="$first" simulate
  exit
fi
shift
git diff --quiet HEAD -- . || die "the working tree has changes: commit or stash them first (mutations patch it)"
names=("$@")
if [[ ${#names[@]} -eq 0 ]]; then
  for p in hack/mutations/*.patch; do
    grep -q '^# simulator' "$p" && names+=("$(basename "$p" .patch)")
  done
fi
restore() { git checkout --quiet HEAD -- alloc controller crd; }
trap restore EXIT
budget="${NODEIPAM_SIM_SECONDS:-60}"
results=()
for name in "${names[@]}"; do
  patch="hack/mutations/$name.patch"
  [[ -f "$patch" ]] || die "no such mutation: $patch"
  git apply "$patch" || die "$patch no longer applies"
  out="$NODEIPAM_CACHE/simulate-$name.log"
  start=$SECONDS
  which=seeded_schedules_keep_every_invariant
  if grep -q '^# simulator leadership beyond' "$patch"; then
    which=beyond_the_bound_a_late_write_is_sealed_off
  elif grep -q '^# simulator leadership' "$patch"; then
    which=leadership_schedules_keep_one_writer
  fi
  log "mutation $name: simulating ($which) for up to ${budget}s"
  if ! cargo test --quiet --locked -p nodeipam-alloc --test simulator --no-run >"$out" 2>&1; then
    verdict="DOES NOT BUILD (see $out)"
  elif NODEIPAM_SIM_SECONDS="$budget" simulate "$which" >>"$out" 2>&1; then
    verdict="SURVIVED (no seed broke an invariant)"
  else
    found=$(sed -n 's/.*invariant broken at step [0-9]* of seed Some(\([0-9]*\)) (\([0-9]*\) seeds, \([0-9]*\) steps tried): \([^:]*\):.*/seed \1, \2 seeds, \3 steps: \4/p' "$out" | head -1)
    verdict="found: ${found:-see $out}"
  fi
  results+=("$(printf '%-48s %4ss  %s' "$name" "$((SECONDS - start))" "$verdict")")
  restore
done
printf '%s\n' "mutation                                          time  verdict" "${results[@]}"
! printf '%s\n' "${results[@]}" | grep -q -e SURVIVED -e 'DOES NOT BUILD'
