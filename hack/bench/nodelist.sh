#!/usr/bin/env bash
# Our protobuf Node-list reader against prost with slim message structs, on the bytes a
# start-up reads: a fresh control plane filled with N Nodes (65,000 by default), its Node list
# captured in protobuf pages of 2,000 (`nodeipam-bench capture-node-lists`), then both decoders
# timed on those pages (bench/benches/nodelist.rs says what is measured).
#   hack/bench/nodelist.sh [--nodes N] [--rounds R] [--pages DIR]
# --pages reuses a folder captured before (skips the control plane).
# Writes bench-results/nodelist-<UTC date>.txt and prints the table.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$NODEIPAM_ROOT"
claim_target

NODES=65000 ROUNDS=20 PAGES=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) NODES="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --pages) PAGES="$2"; shift 2 ;;
    *) echo "usage: $0 [--nodes N] [--rounds R] [--pages DIR]" >&2; exit 2 ;;
  esac
done
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$NODEIPAM_ROOT/bench-results/nodelist-$STAMP.txt"
mkdir -p "$NODEIPAM_ROOT/bench-results"

if [[ -z "$PAGES" ]]; then
  PAGES="$NODEIPAM_CACHE/bench/nodelist-$STAMP"
  timed "control-plane binaries" hack/control-plane.sh build
  timed "cargo build --release nodeipam-bench" \
    cargo build --release --locked --quiet -p nodeipam-bench --bin nodeipam-bench
  timed "capturing $NODES nodes in protobuf pages" \
    "$CARGO_TARGET_DIR/release/nodeipam-bench" capture-node-lists --nodes "$NODES" --out "$PAGES"
fi
log "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; pages in $PAGES"
NODELIST_PAGES="$PAGES" cargo bench --locked -q -p nodeipam-bench --bench nodelist -- "$ROUNDS" | tee "$OUT"
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg); wrote ${OUT#"$NODEIPAM_ROOT"/}"
