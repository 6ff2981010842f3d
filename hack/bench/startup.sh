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
exec "$(dirname "$0")/run-contenders.sh" startup "$@"
