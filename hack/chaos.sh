#!/usr/bin/env bash
# The soak (tests/tests/chaos/main.rs): three replicas, each behind a fault proxy, a nemesis and
# a checker that replays every etcd revision against the rule above all.
#   hack/chaos.sh [--minutes N] [--seed S] [--mutation NAME]
# --mutation puts back hack/mutations/NAME.patch for the run (the tree must be clean) and
# restores the tree after it: the run must then fail. Prints the seed; a failure prints the
# nemesis and workload logs. CI runs 3 minutes of it inside `cargo test`.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$NODEIPAM_ROOT"
claim_target

minutes=3 seed="" mutation=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --mutation) mutation="$2"; shift 2 ;;
    *) die "unknown argument $1 (see the header of $0)" ;;
  esac
done
timed "control-plane binaries" "$NODEIPAM_ROOT/hack/control-plane.sh" build
ensure_libfaketime
if [[ -n "$mutation" ]]; then
  git diff --quiet HEAD -- . || die "the working tree has changes: commit or stash them first (--mutation patches it)"
  restore() { git checkout --quiet HEAD -- alloc controller crd webhook tests config; }
  trap restore EXIT
  git apply "hack/mutations/$mutation.patch" || die "hack/mutations/$mutation.patch no longer applies"
  log "mutation $mutation put back for this run"
fi
timed "cargo build nodeipam" cargo build --quiet --locked -p nodeipam-controller --bin nodeipam
timed "cargo build the soak" cargo test --quiet --locked -p nodeipam-testenv --test chaos --no-run
exe="$(cargo test --quiet --locked -p nodeipam-testenv --test chaos --no-run --message-format=json \
  | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)"
[[ -x "$exe" ]] || die "step=chaos-build: no test executable found for tests/tests/chaos"
# Private copies, so that builds during a long soak (other work, another checkout) neither
# swap the binary a restarted replica runs nor wait for this run (claim_target's lock).
run="$(mktemp -d "${TMPDIR:-/tmp}/nodeipam-chaos.XXXXXX")"
trap 'rm -rf "$run"; [[ -n "$mutation" ]] && restore' EXIT
cp "$CARGO_TARGET_DIR/debug/nodeipam" "$exe" "$run/"
[[ -n "$mutation" ]] && restore && trap 'rm -rf "$run"' EXIT
flock -u 9
export NODEIPAM_BIN="$run/nodeipam" NODEIPAM_CHAOS_MINUTES="$minutes"
[[ -n "$seed" ]] && export NODEIPAM_CHAOS_SEED="$seed"
# The test finds its fixtures from the crate's folder, as cargo test runs it.
timed "chaos for ${minutes} minutes" bash -c "cd '$NODEIPAM_ROOT/tests' && '$run/$(basename "$exe")' --nocapture"
