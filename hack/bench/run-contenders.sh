#!/usr/bin/env bash
# Shared by burst.sh, fleet.sh, startup.sh and failover.sh: builds the control plane and the
# release binaries, copies them aside (with fleet.sh's BENCH_KWOK, KWOK and its stages too), and
# runs `nodeipam-bench KIND` with the contender logs in a fresh work folder.
#   hack/bench/run-contenders.sh burst|startup [nodeipam-bench flags]
# Writes bench-results/KIND-<UTC date>.json.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$NODEIPAM_ROOT"
claim_target

KIND="${1:?usage: $0 burst|startup [flags]}"
shift
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$NODEIPAM_ROOT/bench-results/$KIND-$STAMP.json"
WORK="$NODEIPAM_CACHE/bench/$KIND-$STAMP"
mkdir -p "$WORK" "$NODEIPAM_ROOT/bench-results"

timed "control-plane binaries" hack/control-plane.sh build
# --bin names binaries across every package given, so each binary is named.
timed "cargo build --release nodeipam, nodeipam-bench" \
  cargo build --release --quiet -p nodeipam-controller -p nodeipam-bench --bin nodeipam --bin nodeipam-bench
# Private copies: another build in the shared target folder must not swap them mid-run.
mkdir -p "$WORK/bin"
cp "$CARGO_TARGET_DIR/release/nodeipam" "$CARGO_TARGET_DIR/release/nodeipam-bench" "$WORK/bin/"
# fleet.sh: KWOK too, and the stages it plays (hack/kwok/stages), as they are now.
EXTRA=()
if [[ -n "${BENCH_KWOK:-}" ]]; then
  cp "$BENCH_KWOK" "$WORK/bin/kwok"
  cp -r "$NODEIPAM_ROOT/hack/kwok/stages" "$WORK/kwok-stages"
  EXTRA+=(--kwok "$WORK/bin/kwok" --kwok-stages "$WORK/kwok-stages")
fi
# The run itself needs no build folder: other builds may go on meanwhile (claim_target's lock).
flock -u 9
log "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; contender logs in $WORK"
"$WORK/bin/nodeipam-bench" "$KIND" \
  --nodeipam "$WORK/bin/nodeipam" --work "$WORK" --out "$OUT" "${EXTRA[@]}" "$@"
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg); results: $OUT"
