#!/usr/bin/env bash
# The kubelet-like fleet, side by side: the burst (hack/bench/burst.sh) with `--fleet kwok`. For
# each size and each contender, a fresh control plane, a KWOK process (hack/kwok.sh build) that
# manages only the Nodes annotated kwok.x-k8s.io/node=fake and plays their kubelets with the
# stages of hack/kwok/stages/ (a status update at registration with Ready=False and the CNI not
# initialized, Ready 0.5-2.5 s later, a heartbeat every 20-25 s), then N such Nodes created at
# once; times each node from creation to podCIDRs, counts the contender's Node writes and 409s
# per node and KWOK's status updates from the audit log. A run stops at --time-limit (300 s)
# and reports how many nodes were served.
#   hack/bench/fleet.sh [--nodes 1000,5000] [--rounds 1] [--contenders nodeipam-default,kcm]
#                       [--qps 50] [--burst 100] [--kwok-heartbeat=false] [--time-limit 300]
#                       [other `nodeipam-bench burst` flags]
# Defaults here: contenders nodeipam-default,kcm at --qps 50 --burst 100 (give them to change).
# Writes bench-results/burst-<UTC date>.json; `nodeipam-bench report FILE` prints its tables.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

"$NODEIPAM_ROOT/hack/kwok.sh" build
args=("$@") has_contenders=false has_qps=false has_burst=false
for a in "$@"; do
  case "$a" in
    --contenders|--contenders=*) has_contenders=true ;;
    --qps|--qps=*) has_qps=true ;;
    --burst|--burst=*) has_burst=true ;;
    --fleet|--fleet=*|--kwok|--kwok=*) die "step=fleet-args: $0 sets $a itself" ;;
  esac
done
[[ "$has_contenders" == true ]] || args+=(--contenders nodeipam-default,kcm)
[[ "$has_qps" == true ]] || args+=(--qps 50)
[[ "$has_burst" == true ]] || args+=(--burst 100)
# run-contenders.sh copies the kwok binary aside with the others and passes --kwok.
BENCH_KWOK="$NODEIPAM_KWOK" exec "$(dirname "$0")/run-contenders.sh" burst --fleet kwok "${args[@]}"
