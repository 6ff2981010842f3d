#!/usr/bin/env bash
# Builds the pinned etcdutl (hack/etcdutl/go.mod, at the etcd version of hack/lib.sh) from the
# Go module proxy, for the end-to-end test that restores etcd from a snapshot as an operator
# does (tests/tests/etcd_restore.rs). Cached outside git with a stamp of its inputs: a second
# run with nothing changed is a no-op and needs no Go. Apart from the control-plane binaries
# (hack/control-plane.sh), so that their stamp does not move with it.
#   build   build $NODEIPAM_ETCDUTL if missing or stale
#   path    print $NODEIPAM_ETCDUTL
set -euo pipefail
source "$(dirname "$0")/lib.sh"

MOD_DIR="$NODEIPAM_ROOT/hack/etcdutl"

cmd_build() {
  local want
  want="$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/etcdutl/v3" {print $3}' "$MOD_DIR/go.mod")"
  [[ "$want" == "$ETCD_VERSION" ]] \
    || die "step=etcdutl-version: hack/etcdutl/go.mod requires etcdutl $want but hack/lib.sh says ETCD_VERSION=$ETCD_VERSION"
  local out stamp
  out="$(dirname "$NODEIPAM_ETCDUTL")"
  # The inputs only: no `go env` here, so a warm cache works without Go installed.
  stamp="$(cat "$MOD_DIR"/go.{mod,sum} "$MOD_DIR/tools.go" "$0" | sha256sum | cut -c1-16)"
  if [[ -x "$NODEIPAM_ETCDUTL" && -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$stamp" ]]; then
    log "etcdutl $ETCD_VERSION up to date at $NODEIPAM_ETCDUTL"
    return 0
  fi
  command -v go >/dev/null || die "step=etcdutl-build: 'go' is not installed (needed once to build etcdutl $ETCD_VERSION)"
  mkdir -p "$out"
  timed "go mod download (etcdutl $ETCD_VERSION)" bash -c "cd '$MOD_DIR' && go mod download"
  timed "build etcdutl $ETCD_VERSION" bash -c "cd '$MOD_DIR' && CGO_ENABLED=0 GOFLAGS=-mod=readonly \
    go build -trimpath -ldflags '-s -w' -o '$out/etcdutl' go.etcd.io/etcd/etcdutl/v3"
  "$NODEIPAM_ETCDUTL" version | sed -n 1p >&2
  echo "$stamp" > "$out/.stamp"
}

case "${1:-}" in
  build) cmd_build ;;
  path) echo "$NODEIPAM_ETCDUTL" ;;
  *) echo "usage: $0 build|path" >&2; exit 2 ;;
esac
