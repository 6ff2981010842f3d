#!/usr/bin/env bash
# Builds the pinned Helm v3 (hack/helm/go.mod) from the Go module proxy, for the chart tests
# (tests/tests/helm.rs) and the chart's users on this machine. Cached outside git with a stamp
# of its inputs: a second run with nothing changed is a no-op and needs no Go.
#   build   build $NODEIPAM_HELM if missing or stale
#   path    print $NODEIPAM_HELM
set -euo pipefail
source "$(dirname "$0")/lib.sh"

MOD_DIR="$NODEIPAM_ROOT/hack/helm"

cmd_build() {
  local want
  want="$(awk '$1 == "require" && $2 == "helm.sh/helm/v3" {print $3}' "$MOD_DIR/go.mod")"
  [[ "$want" == "$HELM_VERSION" ]] \
    || die "step=helm-version: hack/helm/go.mod requires helm $want but hack/lib.sh says HELM_VERSION=$HELM_VERSION"
  local out stamp
  out="$(dirname "$NODEIPAM_HELM")"
  # The inputs only: no `go env` here, so a warm cache works without Go installed.
  stamp="$(cat "$MOD_DIR"/go.{mod,sum} "$MOD_DIR/tools.go" "$0" | sha256sum | cut -c1-16)"
  if [[ -x "$NODEIPAM_HELM" && -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$stamp" ]]; then
    log "helm $HELM_VERSION up to date at $NODEIPAM_HELM"
    return 0
  fi
  command -v go >/dev/null || die "step=helm-build: 'go' is not installed (needed once to build helm $HELM_VERSION)"
  mkdir -p "$out"
  timed "go mod download (helm $HELM_VERSION)" bash -c "cd '$MOD_DIR' && go mod download"
  # Helm's own Makefile sets these: the version it reports, and the Kubernetes version that
  # `helm template` and `helm lint` assume (that of its client-go, which the chart's
  # kubeVersion is checked against).
  local client_go major minor ldflags
  client_go="$(cd "$MOD_DIR" && go list -m -f '{{.Version}}' k8s.io/client-go)"
  major=1  # client-go v0.N is Kubernetes 1.N
  minor="$(echo "$client_go" | cut -d. -f2)"
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  local pkg
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $pkg.k8sVersionMajor=$major -X $pkg.k8sVersionMinor=$minor"
  done
  timed "build helm $HELM_VERSION" bash -c "cd '$MOD_DIR' && CGO_ENABLED=0 GOFLAGS=-mod=readonly \
    go build -trimpath -ldflags '$ldflags' -o '$out/' helm.sh/helm/v3/cmd/helm"
  "$NODEIPAM_HELM" version >&2
  echo "$stamp" > "$out/.stamp"
}

case "${1:-}" in
  build) cmd_build ;;
  path) echo "$NODEIPAM_HELM" ;;
  *) echo "usage: $0 build|path" >&2; exit 2 ;;
esac
