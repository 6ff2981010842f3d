#!/usr/bin/env bash
# Builds the pinned KWOK (hack/kwok/go.mod) from the Go module proxy, for the kubelet-like fleet
# benchmark (hack/bench/fleet.sh): its kwok process plays the kubelets of the fake Nodes, with
# the stages of hack/kwok/stages/. Cached outside git under $NODEIPAM_BIN_DIR with a stamp of
# its inputs and the Go version: rebuilt only when the pins (or Go) change.
#   build   build $NODEIPAM_KWOK if missing or stale
#   path    print $NODEIPAM_KWOK
set -euo pipefail
source "$(dirname "$0")/lib.sh"

MOD_DIR="$NODEIPAM_ROOT/hack/kwok"

cmd_build() {
  local want
  want="$(awk '$1 == "require" && $2 == "sigs.k8s.io/kwok" {print $3}' "$MOD_DIR/go.mod")"
  [[ "$want" == "$KWOK_VERSION" ]] \
    || die "step=kwok-version: hack/kwok/go.mod requires kwok $want but hack/lib.sh says KWOK_VERSION=$KWOK_VERSION"
  command -v go >/dev/null || die "step=build-kwok: 'go' is not installed"
  local out stamp
  out="$(dirname "$NODEIPAM_KWOK")"
  stamp="$(cat "$MOD_DIR"/go.{mod,sum} "$MOD_DIR/tools.go" "$0" | sha256sum | cut -c1-16) $(go env GOVERSION)"
  if [[ -x "$NODEIPAM_KWOK" && -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$stamp" ]]; then
    log "kwok $KWOK_VERSION up to date at $NODEIPAM_KWOK"
    return 0
  fi
  mkdir -p "$out"
  rm -f "$out/.stamp"
  (cd "$MOD_DIR" && go mod download) || die "step=build-kwok: go mod download in hack/kwok failed"
  # The version kwok reports (and writes into nodeInfo when a stage asks for it), as its own
  # release build sets it (hack/releases.sh in sigs.k8s.io/kwok).
  local ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
  log "build kwok $KWOK_VERSION ..."
  (cd "$MOD_DIR" && CGO_ENABLED=0 GOFLAGS=-mod=readonly \
    go build -trimpath -ldflags "$ldflags" -o "$out/kwok" sigs.k8s.io/kwok/cmd/kwok) \
    || die "step=build-kwok: go build sigs.k8s.io/kwok/cmd/kwok failed"
  "$NODEIPAM_KWOK" --version >&2 || die "step=build-kwok: the built kwok does not run"
  echo "$stamp" > "$out/.stamp"
}

case "${1:-}" in
  build) cmd_build ;;
  path) echo "$NODEIPAM_KWOK" ;;
  *) echo "usage: $0 build|path" >&2; exit 2 ;;
esac
