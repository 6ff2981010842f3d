#!/usr/bin/env bash
# Builds and runs the local control plane (etcd + kube-apiserver) used by the tests and the demo.
#   build   build kube-apiserver, kube-controller-manager, kubectl (k8s.io/kubernetes) and etcd
#           from the Go module proxy at the versions pinned in hack/k8s and hack/etcd
#   up      start a standalone control plane in the background; prints the KUBECONFIG export
#   down    stop it
#   path    print the folder that holds the binaries
#   inputs  print the hash of what they are built from (the first half of their .stamp)
# With the binaries of the current inputs cached, none of these needs Go.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

STATE_DIR="$NODEIPAM_CACHE/control-plane"

build_go() { # build_go MODULE_DIR OUT_DIR LDFLAGS PKG...
  local mod="$1" out="$2" ldflags="$3"; shift 3
  (cd "$NODEIPAM_ROOT/$mod" && CGO_ENABLED=0 GOFLAGS=-mod=readonly \
    go build -trimpath -ldflags "$ldflags" -o "$out/" "$@")
}

# build_binaries: the recipe. Its text is part of the stamp, so changing it rebuilds.
build_binaries() {
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local v ldk=""
  for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldk+=" -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor"
    ldk+=" -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
  done
  timed "go mod download (k8s $K8S_VERSION)" bash -c "cd '$NODEIPAM_ROOT/hack/k8s' && go mod download"
  timed "build kube-apiserver $K8S_VERSION" build_go hack/k8s "$NODEIPAM_ASSETS" "-s -w$ldk" k8s.io/kubernetes/cmd/kube-apiserver
  timed "build kube-controller-manager $K8S_VERSION" build_go hack/k8s "$NODEIPAM_ASSETS" "-s -w$ldk" k8s.io/kubernetes/cmd/kube-controller-manager
  timed "build kubectl $K8S_VERSION" build_go hack/k8s "$NODEIPAM_ASSETS" "-s -w$ldk" k8s.io/kubernetes/cmd/kubectl
  timed "build etcd $ETCD_VERSION" build_go hack/etcd "$NODEIPAM_ASSETS/etcd-build" "-s -w" go.etcd.io/etcd/server/v3
  mv "$NODEIPAM_ASSETS/etcd-build/server" "$NODEIPAM_ASSETS/etcd" 2>/dev/null \
    || mv "$NODEIPAM_ASSETS/etcd-build/v3" "$NODEIPAM_ASSETS/etcd"
  rmdir "$NODEIPAM_ASSETS/etcd-build"
}

BINARIES=(kube-apiserver kube-controller-manager kubectl etcd)

# inputs_hash: what the binaries are built from (the pinned modules, the versions and the
# recipe), computed without Go; the stamp adds the Go version after it.
inputs_hash() {
  { cat "$NODEIPAM_ROOT"/hack/k8s/go.{mod,sum} "$NODEIPAM_ROOT"/hack/etcd/go.{mod,sum}
    echo "$K8S_VERSION $ETCD_VERSION"
    declare -f build_go build_binaries
  } | sha256sum | cut -c1-16
}

# up_to_date STAMP: the binaries are all there and were built with that stamp (an inputs hash
# alone matches whatever Go version built them).
up_to_date() {
  local want="$1" have b
  [[ -f "$NODEIPAM_ASSETS/.stamp" ]] || return 1
  have="$(cat "$NODEIPAM_ASSETS/.stamp")"
  [[ "$want" == *" "* ]] || have="${have%% *}"
  [[ "$have" == "$want" ]] || return 1
  for b in "${BINARIES[@]}"; do [[ -x "$NODEIPAM_ASSETS/$b" ]] || return 1; done
}

cmd_build() {
  # A stamp of the inputs makes a second run with nothing changed a no-op; with the binaries
  # built from these inputs already cached, Go is not needed at all.
  local inputs stamp
  inputs="$(inputs_hash)"
  if ! command -v go >/dev/null; then
    if up_to_date "$inputs"; then
      log "control-plane binaries up to date in $NODEIPAM_ASSETS (Go not installed, not needed)"
      return 0
    fi
    die "step=build: 'go' is not installed and $NODEIPAM_ASSETS has no binaries built from these inputs (stamp ${inputs})"
  fi
  stamp="$inputs $(go env GOVERSION)"
  if up_to_date "$stamp"; then
    log "control-plane binaries up to date in $NODEIPAM_ASSETS"
    return 0
  fi
  mkdir -p "$NODEIPAM_ASSETS"
  log "building into $NODEIPAM_ASSETS (GOMODCACHE=$(go env GOMODCACHE), GOCACHE=$(go env GOCACHE))"
  build_binaries
  "$NODEIPAM_ASSETS/kube-apiserver" --version >&2
  # Not `| head -1`: etcd writes its version a line at a time, and under pipefail the
  # SIGPIPE of a write after head exited fails the build (seen on a cold machine).
  "$NODEIPAM_ASSETS/etcd" --version | sed -n 1p >&2
  echo "$stamp" > "$NODEIPAM_ASSETS/.stamp"
}

cmd_up() {
  cmd_build
  mkdir -p "$STATE_DIR"
  if [[ -f "$STATE_DIR/pid" ]] && kill -0 "$(cat "$STATE_DIR/pid")" 2>/dev/null; then
    log "control plane already running (pid $(cat "$STATE_DIR/pid"))"
  else
    claim_target
    timed "build the control-plane runner" cargo build --quiet --manifest-path "$NODEIPAM_ROOT/Cargo.toml" -p nodeipam-testenv --bin control-plane
    rm -f "$STATE_DIR/kubeconfig"
    nohup "$CARGO_TARGET_DIR/debug/control-plane" --dir "$STATE_DIR" >"$STATE_DIR/runner.log" 2>&1 9>&- &
    echo $! > "$STATE_DIR/pid"
    local i
    for i in $(seq 1 120); do
      [[ -f "$STATE_DIR/kubeconfig" ]] && break
      kill -0 "$(cat "$STATE_DIR/pid")" 2>/dev/null || { cat "$STATE_DIR/runner.log" >&2; die "step=up: the control plane exited; log: $STATE_DIR/runner.log"; }
      sleep 0.5
    done
    [[ -f "$STATE_DIR/kubeconfig" ]] || die "step=up: no kubeconfig after 60s; log: $STATE_DIR/runner.log"
  fi
  echo "export KUBECONFIG=$STATE_DIR/kubeconfig PATH=$NODEIPAM_ASSETS:\$PATH"
}

cmd_down() {
  if [[ -f "$STATE_DIR/pid" ]] && kill -0 "$(cat "$STATE_DIR/pid")" 2>/dev/null; then
    kill "$(cat "$STATE_DIR/pid")"
    local i
    for i in $(seq 1 40); do kill -0 "$(cat "$STATE_DIR/pid")" 2>/dev/null || break; sleep 0.25; done
    log "control plane stopped"
  else
    log "control plane not running"
  fi
  rm -f "$STATE_DIR/pid" "$STATE_DIR/kubeconfig"
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  down) cmd_down ;;
  path) echo "$NODEIPAM_ASSETS" ;;
  inputs) inputs_hash ;;
  *) echo "usage: $0 build|up|down|path|inputs" >&2; exit 2 ;;
esac
