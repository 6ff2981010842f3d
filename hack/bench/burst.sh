#!/usr/bin/env bash
# The burst, side by side: for each size and each contender, a fresh control plane (etcd +
# kube-apiserver v1.37.2 from hack/control-plane.sh), then N Nodes created as fast as the API
# server takes them (32 in flight) while the contender allocates; an observer's watch times
# each node from its creation to its podCIDRs. Contenders: nodeipam, kube-controller-manager
# (only node-ipam-controller), and the floor (a plain patcher: watch, write the next block).
#   hack/bench/burst.sh [--nodes 1000,5000] [--contenders nodeipam,kcm,floor]
#                       [--qps 500] [--burst 1000] [--rounds 1] [other `nodeipam-bench burst` flags]
# Every contender gets the same --qps/--burst (nodeipam --kube-api-qps/--kube-api-burst, kcm
# the same flags, the floor its own token bucket). Other scenarios:
#   --load-qps 100          nodes arrive at a steady 100/s instead of all at once
#   --mode backlog          nodes created first, then the contender started (write throughput)
#   --existing 50000        that many nodes with podCIDRs in the cluster before the contender
#   --contenders floor-like-nodeipam   the floor writing nodeipam's patch (annotation, UID)
# Writes bench-results/burst-<UTC date>.json; `nodeipam-bench report FILE` prints its tables.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$NODEIPAM_ROOT"

STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$NODEIPAM_ROOT/bench-results/burst-$STAMP.json"
WORK="$NODEIPAM_CACHE/bench/burst-$STAMP"
mkdir -p "$WORK" "$NODEIPAM_ROOT/bench-results"

timed "control-plane binaries" hack/control-plane.sh build
timed "cargo build --release nodeipam, nodeipam-bench" \
  cargo build --release --quiet -p nodeipam-controller --bin nodeipam -p nodeipam-bench
# Private copies: another build in the shared target folder must not swap them mid-run.
mkdir -p "$WORK/bin"
cp "$CARGO_TARGET_DIR/release/nodeipam" "$CARGO_TARGET_DIR/release/nodeipam-bench" "$WORK/bin/"
log "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; contender logs in $WORK"
"$WORK/bin/nodeipam-bench" burst \
  --nodeipam "$WORK/bin/nodeipam" --work "$WORK" --out "$OUT" "$@"
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg); results: $OUT"
