#!/usr/bin/env bash
# The allocator alone, side by side: our CidrSet (criterion, controller/benches/cidrset.rs and
# bench/benches/allocator.rs) and kube-controller-manager's cidrset (its own
# BenchmarkAllocateAll_* from k8s.io/kubernetes v1.37.2, plus hack/bench/kcm/allocate_test.go for
# the IPv4 sizes it lacks). Both time one iteration as: allocate every block of the range plus
# one (which fails), then release the whole range; the table divides by the number of blocks.
#   hack/bench/allocator.sh [--quick]     (--quick: shorter measurements, for a smoke test)
# Writes bench-results/allocator-<UTC date>.json and prints the table.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$NODEIPAM_ROOT"
claim_target

QUICK=false
case "${1:-}" in
  --quick) QUICK=true ;;
  "") ;;
  *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac
command -v go >/dev/null || die "step=prerequisites: 'go' is not installed"

WORK="$NODEIPAM_CACHE/bench/allocator"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$NODEIPAM_ROOT/bench-results/allocator-$STAMP.json"
mkdir -p "$WORK" "$NODEIPAM_ROOT/bench-results"
log "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

# Criterion writes to a fresh folder so that no earlier or foreign run's estimates get mixed in.
export CRITERION_HOME="$WORK/criterion-$STAMP"
if [[ "$QUICK" == true ]]; then
  CRIT_ARGS=(--warm-up-time 1 --measurement-time 1 --noplot)
  GO_BENCHTIME=200ms
else
  CRIT_ARGS=(--warm-up-time 2 --measurement-time 4 --noplot)
  GO_BENCHTIME=2s
fi
timed "cargo build nodeipam-bench (release)" cargo build --release --quiet -p nodeipam-bench
timed "criterion: controller/benches/cidrset.rs allocate_all" \
  cargo bench --quiet -p nodeipam-controller --bench cidrset -- allocate_all "${CRIT_ARGS[@]}"
timed "criterion: bench/benches/allocator.rs allocate_all/8_24" \
  cargo bench --quiet -p nodeipam-bench --bench allocator -- allocate_all "${CRIT_ARGS[@]}"

# kcm's benchmarks run in a scratch copy of hack/k8s, so that neither its go.sum (the stamp
# of the control-plane build) nor the tree changes; -mod=mod lets go add test-only sums there.
MOD="$WORK/k8s-module"
rm -rf "$MOD"; mkdir -p "$MOD/kcmbench"
cp hack/k8s/go.mod hack/k8s/go.sum hack/k8s/tools.go "$MOD/"
cp hack/bench/kcm/allocate_test.go "$MOD/kcmbench/"
GO_OUT="$WORK/go-bench-$STAMP.txt"
log "load average before go test: $(cut -d' ' -f1-3 /proc/loadavg)"
timed "go test -bench BenchmarkAllocateAll (kcm cidrset, k8s.io/kubernetes v1.37.2)" bash -c "
  cd '$MOD' && go test -mod=mod -run '^\$' -bench 'BenchmarkAllocateAll' -benchmem -benchtime '$GO_BENCHTIME' \
    k8s.io/kubernetes/pkg/controller/nodeipam/ipam/cidrset ./kcmbench > '$GO_OUT' 2>&1 \
    || { cat '$GO_OUT' >&2; exit 1; }"
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

cp "$CARGO_TARGET_DIR/release/nodeipam-bench" "$WORK/nodeipam-bench-$STAMP"
"$WORK/nodeipam-bench-$STAMP" allocator \
  --criterion "$CRITERION_HOME" --go "$GO_OUT" --out "$OUT"
log "results: $OUT"
