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
#   --kubelets              every node updates its status as a kubelet (the bench's own kubelets)
#   --fleet kwok            the same played by KWOK with hack/kwok/stages: run hack/bench/fleet.sh
# Writes bench-results/burst-<UTC date>.json; `nodeipam-bench report FILE` prints its tables.
exec "$(dirname "$0")/run-contenders.sh" burst "$@"
