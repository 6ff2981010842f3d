#!/usr/bin/env bash
# The nodeipam demo, from a fresh clone: a local control plane (etcd + kube-apiserver, built on
# first use), the NodeIPAMConfig CRD and samples, and `nodeipam run` in the background with
# leader election, the validating webhook (registered by URL) and the least-privilege RBAC of
# config/rbac. It creates a few dozen Nodes, shows their podCIDRs, drains a config two ways
# (disable, delete), lets a NodeIPAMPool grow with a burst of nodes and retire the ranges it no
# longer needs, shows `kubectl nodeipam ranges` and `check` (clean, then a hand-made overlap
# reported, then clean again) and stops everything it started.
#   hack/demo.sh          run the demo, then stop the controller and the control plane
#   hack/demo.sh --keep   leave both running (stop with: kill <pid>; hack/control-plane.sh down)
# Ports: NODEIPAM_DEMO_METRICS_PORT (8085, HTTPS), NODEIPAM_DEMO_PROBE_PORT (8086) and
# NODEIPAM_DEMO_WEBHOOK_PORT (9445), on 127.0.0.1. The webhook is registered by URL as
# ValidatingWebhookConfiguration nodeipam-webhook-demo, so that `kubectl apply -k config/default`
# on a kept demo creates its own (by Service) instead of clashing with it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$NODEIPAM_ROOT"
claim_target

KEEP=false
case "${1:-}" in
  --keep) KEEP=true ;;
  "") ;;
  *) echo "usage: $0 [--keep]" >&2; exit 2 ;;
esac
METRICS_PORT="${NODEIPAM_DEMO_METRICS_PORT:-8085}"
WEBHOOK_PORT="${NODEIPAM_DEMO_WEBHOOK_PORT:-9445}"
PROBE_PORT="${NODEIPAM_DEMO_PROBE_PORT:-8086}"
DEMO_VWC=nodeipam-webhook-demo
NS=nodeipam-system
DEMO_DIR="$NODEIPAM_CACHE/demo"
CONTROLLER_LOG="$DEMO_DIR/nodeipam.log"
CP_PID_FILE="$NODEIPAM_CACHE/control-plane/pid"
DEMO_LABEL=nodeipam.io/demo
PLAIN_NODES=24 GPU_NODES=6 V6_NODES=4 BURST_NODES=10

command -v curl >/dev/null || die "step=prerequisites: curl is needed to read the controller's /readyz and /metrics"
mkdir -p "$DEMO_DIR"

now_ms() { date +%s%3N; }
since() { # since START_MS: seconds elapsed, one decimal
  local d=$(( $(now_ms) - $1 ))
  printf '%d.%d' $((d / 1000)) $(((d % 1000) / 100))
}
# The step under way, for a failure to name: the section, or what wait_until waits for.
STEP="start"
section() { STEP="$*"; printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
# The command that failed under `set -e`, and where: the reason a failure names.
FAILED=""
trap 'FAILED="line $LINENO: \`$BASH_COMMAND\` exited $?"' ERR
show() { # show CMD...: print the command, then run it
  printf '\033[2m$ %s\033[0m\n' "$*" >&2
  "$@"
}
TIMINGS=()
record() { TIMINGS+=("$(printf '%-44s %6ss' "$1" "$2")"); }

# wait_until WHAT TIMEOUT_S CMD...: polls CMD every 0.2 s; on timeout, names WHAT and shows
# what CMD said last.
wait_until() {
  local what="$1" timeout="$2"; shift 2
  local deadline=$(( $(now_ms) + timeout * 1000 )) last="$DEMO_DIR/wait.out"
  until "$@" >"$last" 2>&1; do
    controller_alive || die "step=$what: the controller exited; log: $CONTROLLER_LOG"$'\n'"$(tail -20 "$CONTROLLER_LOG")"
    (( $(now_ms) < deadline )) || die "step=$what: not done within ${timeout}s; its last answer:"$'\n'"$(tail -20 "$last")"$'\n'"controller log: $CONTROLLER_LOG"
    sleep 0.2
  done
}
# What the steps show is written by the controller a moment after the change: the configs'
# counts at most once a second, the outputs after the nodes. A check that finds nothing, from
# one look, says it has all been written.
settled() { kubectl nodeipam check --settle=0s; }

NODEIPAM_PID=""
STARTED_CP=false
controller_alive() { [[ -z "$NODEIPAM_PID" ]] || kill -0 "$NODEIPAM_PID" 2>/dev/null; }

stop_controller() {
  if [[ -n "$NODEIPAM_PID" ]] && kill -0 "$NODEIPAM_PID" 2>/dev/null; then
    kill -TERM "$NODEIPAM_PID"
    local rc=0
    wait "$NODEIPAM_PID" || rc=$?
    log "controller stopped (exit $rc)"
  fi
  NODEIPAM_PID=""
}

cleanup() {
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    # die named the step and reason already; a command that failed under `set -e` did not.
    log "demo failed: step=$STEP: ${FAILED:-exit $rc (reason above)}"
    if [[ -n "$NODEIPAM_PID" ]]; then
      log "last controller log lines ($CONTROLLER_LOG):"
      tail -15 "$CONTROLLER_LOG" >&2 || true
    fi
  fi
  if [[ "$KEEP" == true && $rc -eq 0 ]]; then
    return
  fi
  stop_controller
  if [[ "$STARTED_CP" == true ]]; then
    "$NODEIPAM_ROOT/hack/control-plane.sh" down
  fi
}
trap cleanup EXIT

START=$(now_ms)

# ---------------------------------------------------------------------------------------------
section "1. Control plane"
if [[ -f "$CP_PID_FILE" ]] && kill -0 "$(cat "$CP_PID_FILE")" 2>/dev/null; then
  log "reusing the running control plane (left running: it is not stopped at the end)"
else
  STARTED_CP=true
fi
t=$(now_ms)
eval "$("$NODEIPAM_ROOT/hack/control-plane.sh" up)"
record "control plane up (builds on first use)" "$(since "$t")"
log "KUBECONFIG=$KUBECONFIG"
if [[ "$STARTED_CP" == false ]] && [[ -n "$(kubectl get nodes -l "$DEMO_LABEL" -o name 2>/dev/null)" ]]; then
  die "step=control-plane: nodes of an earlier demo are still there; start afresh with: hack/control-plane.sh down"
fi

# ---------------------------------------------------------------------------------------------
section "2. CRD, namespace, RBAC and the webhook registration"
# Server-side: the control plane already installed the CRD from config/crd/bases.
show kubectl apply --server-side --force-conflicts -k config/crd
kubectl wait --for=condition=Established crd/nodeipamconfigs.nodeipam.io --timeout=60s >/dev/null
show kubectl apply -f config/manager/namespace.yaml
show kubectl apply -k config/rbac
# The controller runs as its ServiceAccount, with a token: exactly the rights of config/rbac.
CONTROLLER_KUBECONFIG="$DEMO_DIR/controller.kubeconfig"
cp "$KUBECONFIG" "$CONTROLLER_KUBECONFIG"
TOKEN="$(kubectl -n "$NS" create token nodeipam-controller --duration=12h)"
kubectl --kubeconfig="$CONTROLLER_KUBECONFIG" config set-credentials nodeipam-controller --token="$TOKEN" >/dev/null
kubectl --kubeconfig="$CONTROLLER_KUBECONFIG" config set-context --current --user=nodeipam-controller >/dev/null
kubectl --kubeconfig="$CONTROLLER_KUBECONFIG" auth whoami -o jsonpath='{.status.userInfo.username}' | sed 's/^/controller identity: /' >&2; echo >&2
# The webhook configuration of config/webhook, but under its own name and reaching the local
# process by URL instead of the in-cluster Service. caBundle stays empty: the controller
# patches it (--webhook-config), with rights for that name alone.
sed "s/^  name: nodeipam-webhook\$/  name: $DEMO_VWC/" config/webhook/manifests.yaml | show kubectl apply -f -
kubectl create clusterrole nodeipam-demo-webhook --verb=get,list,watch,update \
  --resource=validatingwebhookconfigurations.admissionregistration.k8s.io --resource-name="$DEMO_VWC" \
  --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl create clusterrolebinding nodeipam-demo-webhook --clusterrole=nodeipam-demo-webhook \
  --serviceaccount="$NS:nodeipam-controller" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
show kubectl patch validatingwebhookconfiguration "$DEMO_VWC" --type=json -p \
  "[{\"op\":\"replace\",\"path\":\"/webhooks/0/clientConfig\",\"value\":{\"url\":\"https://127.0.0.1:$WEBHOOK_PORT/validate-nodeipamconfig\"}}]"

# ---------------------------------------------------------------------------------------------
section "3. Build and start the controller"
t=$(now_ms)
timed "cargo build nodeipam, kubectl-nodeipam" \
  cargo build --quiet -p nodeipam-controller -p nodeipam-cli --bin nodeipam --bin kubectl-nodeipam
record "cargo build nodeipam, kubectl-nodeipam" "$(since "$t")"
# kubectl finds plugins on PATH: kubectl-nodeipam is `kubectl nodeipam`.
export PATH="$CARGO_TARGET_DIR/debug:$PATH"
t=$(now_ms)
"$CARGO_TARGET_DIR/debug/nodeipam" run \
  --kubeconfig="$CONTROLLER_KUBECONFIG" \
  --namespace="$NS" \
  --identity=demo-0 \
  --metrics-bind-address="127.0.0.1:$METRICS_PORT" \
  --health-probe-bind-address="127.0.0.1:$PROBE_PORT" \
  --webhook-addr="127.0.0.1:$WEBHOOK_PORT" \
  --webhook-config="$DEMO_VWC" \
  --webhook-dns-names=127.0.0.1 \
  >"$CONTROLLER_LOG" 2>&1 9>&- &
NODEIPAM_PID=$!
log "nodeipam run: pid $NODEIPAM_PID, log $CONTROLLER_LOG"
wait_until "controller ready" 60 curl -fsS "http://127.0.0.1:$PROBE_PORT/readyz"
# /metrics is HTTPS for callers the API server authenticates and authorizes: a scraper's
# ServiceAccount bound to nodeipam-metrics-reader, as Prometheus's would be.
kubectl -n "$NS" create serviceaccount demo-scraper --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl create clusterrolebinding nodeipam-demo-scraper --clusterrole=nodeipam-metrics-reader \
  --serviceaccount="$NS:demo-scraper" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
SCRAPER_TOKEN="$(kubectl -n "$NS" create token demo-scraper --duration=12h)"
scrape() { curl -fksS -H "Authorization: Bearer $SCRAPER_TOKEN" "https://127.0.0.1:$METRICS_PORT/metrics"; }
leading() { scrape | grep -qx 'nodeipam_leader 1'; }
wait_until "leadership" 60 leading
log "a scrape without a token is refused: HTTP $(curl -ksS -o /dev/null -w '%{http_code}' "https://127.0.0.1:$METRICS_PORT/metrics")"
ca_patched() { [[ -n "$(kubectl get validatingwebhookconfiguration "$DEMO_VWC" -o jsonpath='{.webhooks[0].clientConfig.caBundle}')" ]]; }
wait_until "caBundle patched" 60 ca_patched
# The API server picks the new caBundle up a moment later: wait for a verdict of the webhook.
PROBE='{"apiVersion":"nodeipam.io/v1alpha1","kind":"NodeIPAMConfig","metadata":{"name":"overlaps-services"},"spec":{"ipv4":{"cidr":"10.96.0.0/16","perNodeMaskSize":24}}}'
webhook_denies() {
  echo "$PROBE" | kubectl apply --dry-run=server -f - >"$DEMO_DIR/probe.out" 2>&1 && return 1
  grep -q "overlaps the Service range" "$DEMO_DIR/probe.out"
}
wait_until "webhook effective" 60 webhook_denies
record "controller ready, leading, webhook live" "$(since "$t")"
kubectl get lease -n "$NS" nodeipam-controller -o custom-columns=LEASE:.metadata.name,HOLDER:.spec.holderIdentity
log "the webhook refuses a range that overlaps the Service range:"
sed 's/^/    /' "$DEMO_DIR/probe.out" >&2

# ---------------------------------------------------------------------------------------------
section "4. Sample NodeIPAMConfigs (through the webhook)"
show kubectl apply -k config/samples
kubectl wait --for=condition=Ready nodeipamconfig --all --timeout=60s >/dev/null
show kubectl get nodeipamconfigs
log "the webhook refuses a config that overlaps another:"
OVERLAP='{"apiVersion":"nodeipam.io/v1alpha1","kind":"NodeIPAMConfig","metadata":{"name":"overlapping"},"spec":{"ipv4":{"cidr":"10.113.0.0/16","perNodeMaskSize":24}}}'
if echo "$OVERLAP" | kubectl apply -f - >"$DEMO_DIR/overlap.out" 2>&1; then
  die "step=webhook: a config overlapping dual-stack was admitted"
fi
sed 's/^/    /' "$DEMO_DIR/overlap.out" >&2

# ---------------------------------------------------------------------------------------------
section "5. $((PLAIN_NODES + GPU_NODES + V6_NODES)) Nodes"
node_doc() { # node_doc NAME [POOL]
  printf -- '- apiVersion: v1\n  kind: Node\n  metadata:\n    name: %s\n    labels:\n      %s: "true"\n' "$1" "$DEMO_LABEL"
  [[ -n "${2:-}" ]] && printf '      nodeipam.io/pool: %s\n' "$2"
  return 0
}
{
  printf 'apiVersion: v1\nkind: List\nitems:\n'
  for i in $(seq -w 1 "$PLAIN_NODES"); do node_doc "worker-$i"; done
  for i in $(seq -w 1 "$GPU_NODES"); do node_doc "gpu-$i" gpu; done
  for i in $(seq -w 1 "$V6_NODES"); do node_doc "v6-$i" ipv6-only; done
} >"$DEMO_DIR/nodes.yaml"
TOTAL=$((PLAIN_NODES + GPU_NODES + V6_NODES))
t=$(now_ms)
kubectl create -f "$DEMO_DIR/nodes.yaml" >/dev/null
all_allocated() {
  [[ "$(kubectl get nodes -l "$DEMO_LABEL" -o jsonpath='{range .items[*]}{.spec.podCIDRs}{"\n"}{end}' | grep -c .)" -eq "$TOTAL" ]]
}
wait_until "allocation" 60 all_allocated
record "$TOTAL nodes created and allocated" "$(since "$t")"
wait_until "allocation counted" 30 settled
show kubectl get nodeipamconfigs -o wide
show kubectl get nodes -o 'custom-columns=NAME:.metadata.name,POOL:.metadata.labels.nodeipam\.io/pool,CONFIG:.metadata.annotations.nodeipam\.io/config,PODCIDRS:.spec.podCIDRs'
log "metrics (https://127.0.0.1:$METRICS_PORT/metrics, as demo-scraper):"
scrape | grep -E '^nodeipam_(config_blocks_allocated|pending_nodes|leader)' | sed 's/^/    /' >&2

# ---------------------------------------------------------------------------------------------
section "6. Drain by disabling: wide-ipv6 hands out nothing more; its nodes keep their blocks"
t=$(now_ms)
show kubectl patch nodeipamconfig wide-ipv6 --type=merge -p '{"spec":{"allocation":"Disabled"}}'
kubectl wait --for=jsonpath='{.status.conditions[?(@.type=="Drained")].reason}'=NodesRemaining nipc/wide-ipv6 --timeout=60s >/dev/null
show kubectl get nipc wide-ipv6 -o 'custom-columns=NAME:.metadata.name,ALLOCATION:.spec.allocation,NODES:.status.nodes,DRAINED:.status.conditions[?(@.type=="Drained")].status,REASON:.status.conditions[?(@.type=="Drained")].reason'
show kubectl delete nodes -l nodeipam.io/pool=ipv6-only
kubectl wait --for=condition=Drained nipc/wide-ipv6 --timeout=60s >/dev/null
show kubectl get nipc wide-ipv6 -o 'custom-columns=NAME:.metadata.name,ALLOCATION:.spec.allocation,NODES:.status.nodes,DRAINED:.status.conditions[?(@.type=="Drained")].status,REASON:.status.conditions[?(@.type=="Drained")].reason'
record "wide-ipv6 disabled and drained" "$(since "$t")"

# ---------------------------------------------------------------------------------------------
section "7. Drain by deleting: gpu-pool stays (finalizer) until its nodes are gone"
t=$(now_ms)
show kubectl delete nipc gpu-pool --wait=false
kubectl wait --for=jsonpath='{.status.conditions[?(@.type=="Drained")].reason}'=NodesRemaining nipc/gpu-pool --timeout=60s >/dev/null
show kubectl get nipc gpu-pool -o 'custom-columns=NAME:.metadata.name,DELETING:.metadata.deletionTimestamp,NODES:.status.nodes,READY:.status.conditions[?(@.type=="Ready")].reason,DRAINED:.status.conditions[?(@.type=="Drained")].status,REASON:.status.conditions[?(@.type=="Drained")].reason'
show kubectl delete nodes -l nodeipam.io/pool=gpu
kubectl wait --for=delete nipc/gpu-pool --timeout=60s >/dev/null
record "gpu-pool deleted and drained" "$(since "$t")"
show kubectl get nodeipamconfigs
log "its last events:"
kubectl get events -n default --field-selector involvedObject.name=gpu-pool \
  -o 'custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message' >&2

# ---------------------------------------------------------------------------------------------
section "8. A NodeIPAMPool grows with a burst of nodes, then retires the ranges it no longer needs"
# Ranges of 4 blocks (a /26 of /28s) so that a burst of $BURST_NODES nodes needs several; a range
# empty for 10 s is retired (in production, minutes: the default is 30m).
cat >"$DEMO_DIR/pool.yaml" <<YAML
apiVersion: nodeipam.io/v1alpha1
kind: NodeIPAMPool
metadata:
  name: burst
spec:
  ipv4:
    cidrs: [10.200.0.0/22]
    rangeMaskSize: 26
    perNodeMaskSize: 28
  nodeSelector:
    nodeSelectorTerms:
      - matchExpressions:
          - {key: nodeipam.io/pool, operator: In, values: [burst]}
  ranges: {min: 1, max: 8}
  headroom: {blocks: 1}
  scaleDown: {emptyFor: 10s}
YAML
t=$(now_ms)
show kubectl apply -f "$DEMO_DIR/pool.yaml"
kubectl wait --for=condition=Ready nodeipampool/burst --timeout=60s >/dev/null
pool_children() { kubectl get nipc -l nodeipam.io/pool=burst -o name | grep -c . || true; }
log "before the burst: $(pool_children) range(s)"
{
  printf 'apiVersion: v1\nkind: List\nitems:\n'
  for i in $(seq -w 1 "$BURST_NODES"); do node_doc "burst-$i" burst; done
} >"$DEMO_DIR/burst.yaml"
kubectl create -f "$DEMO_DIR/burst.yaml" >/dev/null
burst_allocated() {
  [[ "$(kubectl get nodes -l nodeipam.io/pool=burst -o jsonpath='{range .items[*]}{.spec.podCIDRs}{"\n"}{end}' | grep -c .)" -eq "$BURST_NODES" ]]
}
wait_until "pool burst allocation" 90 burst_allocated
record "pool: $BURST_NODES nodes allocated, ranges carved" "$(since "$t")"
wait_until "pool burst counted" 30 settled
show kubectl get nodeipampool burst
show kubectl get nipc -l nodeipam.io/pool=burst -o 'custom-columns=RANGE:.metadata.name,CIDR:.spec.ipv4.cidr,NODES:.status.nodes'
show kubectl nodeipam ranges
t=$(now_ms)
show kubectl delete nodes $(seq -f 'burst-%02g' 2 "$BURST_NODES")
one_range_left() { [[ "$(pool_children)" -eq 1 ]]; }
wait_until "pool retiring its empty ranges" 120 one_range_left
wait_until "pool retirement counted" 30 settled
record "pool: emptied ranges retired down to 1" "$(since "$t")"
log "the pool's events:"
kubectl get events -n default --field-selector involvedObject.name=burst,reason=RangeRetired \
  -o 'custom-columns=REASON:.reason,MESSAGE:.message' >&2
show kubectl get nipc -l nodeipam.io/pool=burst -o 'custom-columns=RANGE:.metadata.name,CIDR:.spec.ipv4.cidr,NODES:.status.nodes'

# ---------------------------------------------------------------------------------------------
section "9. kubectl nodeipam check: the whole cluster against the rules"
show kubectl nodeipam check || die "step=check: the cluster the demo made is not consistent (exit $?)"
ROGUE_CIDR="$(kubectl get node worker-01 -o jsonpath='{.spec.podCIDRs[0]}')"
log "a Node created by hand with worker-01's IPv4 block ($ROGUE_CIDR) as its podCIDR:"
kubectl create -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: rogue
  labels: {$DEMO_LABEL: "true"}
spec:
  podCIDR: $ROGUE_CIDR
  podCIDRs: [$ROGUE_CIDR]
YAML
rc=0
show kubectl nodeipam check || rc=$?
[[ $rc -eq 1 ]] || die "step=check: an overlapping podCIDR was not reported (exit $rc)"
show kubectl delete node rogue
# At once: the counts still include rogue for up to a second, and check looks again at what
# the controller's lag can cause. The controller must not have released worker-01's block when
# the rogue node went.
show kubectl nodeipam check || die "step=check-after-rogue: inconsistent once rogue was deleted (exit $?)"

# ---------------------------------------------------------------------------------------------
if [[ "$KEEP" == false ]]; then
  section "10. Stop: SIGTERM releases the lease"
  t=$(now_ms)
  stop_controller
  record "controller stopped (SIGTERM)" "$(since "$t")"
  show kubectl get lease -n "$NS" nodeipam-controller -o 'custom-columns=LEASE:.metadata.name,HOLDER:.spec.holderIdentity'
fi

section "Timings"
printf '%s\n' "${TIMINGS[@]}" >&2
printf '%-44s %6ss\n' "demo total" "$(since "$START")" >&2
if [[ "$KEEP" == true ]]; then
  log "--keep: still running: the controller (pid $NODEIPAM_PID, stop with: kill $NODEIPAM_PID) and"
  log "the control plane (stop with: hack/control-plane.sh down). To use it:"
  echo "export KUBECONFIG=$KUBECONFIG PATH=$NODEIPAM_ASSETS:\$PATH"
fi
