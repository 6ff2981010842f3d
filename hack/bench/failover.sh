#!/usr/bin/env bash
# Failover, side by side: a control plane filled with N Nodes that hold podCIDRs, then for each
# contender with leader election (nodeipam as installed, kube-controller-manager with
# --leader-elect=true) a leader and a standby; the leader is killed (SIGKILL) and one Node
# created; time from the death to that Node's podCIDRs (lease expiry, take-over, first
# allocation), and the standby's memory.
#   hack/bench/failover.sh [--nodes 50000] [--contenders nodeipam-default,kcm] [--rounds 1]
# Writes bench-results/failover-<UTC date>.json; `nodeipam-bench report FILE` prints its table.
exec "$(dirname "$0")/run-contenders.sh" failover "$@"
