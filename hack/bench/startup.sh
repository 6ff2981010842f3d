#!/usr/bin/env bash
# Start-up, side by side: a control plane filled with N Nodes that already hold podCIDRs, then
# each contender (nodeipam, kube-controller-manager's node-ipam-controller, the floor) started
# in turn; time from the process start to its first log line, to its "synced" line (every node
# read) and to the podCIDRs of a node created just before it started; RSS and CPU at that point.
#   hack/bench/startup.sh [--nodes 5000,50000] [--contenders nodeipam,kcm,floor] [--rounds 1]
#                         [other `nodeipam-bench startup` flags]
# Reference floors that read the nodes differently: floor-slim (parses only name, uid, labels,
# podCIDRs), floor-streaming (a streaming list), floor-unpaged (one list), floor-slim-streaming;
# the floor also takes --page-size by hand (nodeipam-bench floor --help).
# Writes bench-results/startup-<UTC date>.json; `nodeipam-bench report FILE` prints its tables.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$NODEIPAM_ROOT"

STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$NODEIPAM_ROOT/bench-results/startup-$STAMP.json"
WORK="$NODEIPAM_CACHE/bench/startup-$STAMP"
mkdir -p "$WORK" "$NODEIPAM_ROOT/bench-results"

timed "control-plane binaries" hack/control-plane.sh build
timed "cargo build --release nodeipam, nodeipam-bench" \
  cargo build --release --quiet -p nodeipam-controller --bin nodeipam -p nodeipam-bench
# Private copies: another build in the shared target folder must not swap them mid-run.
mkdir -p "$WORK/bin"
cp "$CARGO_TARGET_DIR/release/nodeipam" "$CARGO_TARGET_DIR/release/nodeipam-bench" "$WORK/bin/"
log "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; contender logs in $WORK"
"$WORK/bin/nodeipam-bench" startup \
  --nodeipam "$WORK/bin/nodeipam" --work "$WORK" --out "$OUT" "$@"
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg); results: $OUT"
