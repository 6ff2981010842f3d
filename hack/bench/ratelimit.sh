#!/usr/bin/env bash
# Our API token bucket (controller/src/ratelimit.rs) against governor's direct limiter, shared
# as the controller shares one: 16 node writers that always have work and a sporadic caller
# (bench/benches/ratelimit.rs says what is measured). Rounds interleaved, order swapped each
# round; the table gives the median of the rounds and their spread.
#   hack/bench/ratelimit.sh [ROUNDS]      (12 by default, about 3 s a round per limiter)
# Writes bench-results/ratelimit-<UTC date>.txt and prints the table.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$NODEIPAM_ROOT"
claim_target

ROUNDS="${1:-12}"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [ROUNDS]" >&2; exit 2; }
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$NODEIPAM_ROOT/bench-results/ratelimit-$STAMP.txt"
mkdir -p "$NODEIPAM_ROOT/bench-results"
log "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
cargo bench --locked -q -p nodeipam-bench --bench ratelimit -- "$ROUNDS" | tee "$OUT"
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg); wrote ${OUT#"$NODEIPAM_ROOT"/}"
