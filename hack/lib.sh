# shellcheck shell=bash
# Shared paths and helpers for the hack/ scripts. Source it; do not run it.

NODEIPAM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Every path a test or a tool takes comes from this checkout, not from where a binary was
# compiled (the harness and the control-plane runner read it).
export NODEIPAM_ROOT
# Builds live outside git so that a fresh clone (CI) on the same machine reuses them.
NODEIPAM_CACHE="${NODEIPAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeipam}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$NODEIPAM_CACHE/target}"

K8S_VERSION="v1.37.2"
ETCD_VERSION="v3.6.16"
NODEIPAM_BIN_DIR="$NODEIPAM_CACHE/bin"
# The harness finds the binaries here (see tests/harness).
export NODEIPAM_ASSETS="${NODEIPAM_ASSETS:-$NODEIPAM_BIN_DIR/k8s-$K8S_VERSION-etcd-$ETCD_VERSION}"
# Helm v3 for the chart tests (tests/tests/helm.rs), built by hack/helm.sh; must be the
# version hack/helm/go.mod requires (hack/helm.sh checks).
HELM_VERSION="v3.22.0"
export NODEIPAM_HELM="${NODEIPAM_HELM:-$NODEIPAM_BIN_DIR/helm-$HELM_VERSION/helm}"
# KWOK for the kubelet-like fleet benchmark (hack/bench/fleet.sh), built by hack/kwok.sh; must
# be the version hack/kwok/go.mod requires (hack/kwok.sh checks).
KWOK_VERSION="v0.8.0"
export NODEIPAM_KWOK="${NODEIPAM_KWOK:-$NODEIPAM_BIN_DIR/kwok-$KWOK_VERSION/kwok}"
# etcdutl at the etcd version, for the test that restores etcd from a snapshot (hack/etcdutl.sh).
export NODEIPAM_ETCDUTL="${NODEIPAM_ETCDUTL:-$NODEIPAM_BIN_DIR/etcdutl-$ETCD_VERSION/etcdutl}"
# The project's one version (Cargo.toml's workspace version, docs/versioning.md) and the image a
# release is: `nodeipam:vX.Y.Z` as containerd names it, which config/default and the chart
# deploy unchanged. hack/image.sh builds it and the real-cluster suite deploys it, so the suite
# installs the image hack/release.sh ships, as a user would.
nodeipam_version() { sed -n 's/^version = "\(.*\)"$/\1/p' "$NODEIPAM_ROOT/Cargo.toml" | head -1; }
NODEIPAM_RELEASE_IMAGE_DEFAULT="docker.io/library/nodeipam:v$(nodeipam_version)"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# timed LABEL CMD...: runs CMD and logs how long it took.
timed() {
  local label="$1"; shift
  local start=$SECONDS
  log "$label ..."
  "$@" || die "$label failed (exit $?)"
  log "$label done in $((SECONDS - start))s"
}

# claim_target: the build folder is shared by every checkout on this machine (a fresh clone
# reuses the dependencies), so one checkout at a time builds and tests in it, and a checkout
# that was not the last one to build there rebuilds the workspace's own crates: cargo may
# otherwise take another checkout's binaries as up to date. Held until the script exits.
claim_target() {
  [[ "${NODEIPAM_TARGET_CLAIMED:-}" == "$NODEIPAM_ROOT" ]] && return 0
  command -v flock >/dev/null || die "step=claim-target: 'flock' (util-linux) is not installed"
  mkdir -p "$CARGO_TARGET_DIR"
  exec 9>"$CARGO_TARGET_DIR/.nodeipam-lock"
  if ! flock -n 9; then
    log "waiting for another checkout's build in $CARGO_TARGET_DIR"
    flock 9
  fi
  local last="$CARGO_TARGET_DIR/.nodeipam-root"
  if [[ -f "$last" && "$(cat "$last")" != "$NODEIPAM_ROOT" ]]; then
    log "$CARGO_TARGET_DIR was last built from $(cat "$last"): rebuilding this checkout's crates"
    cargo clean --quiet --manifest-path "$NODEIPAM_ROOT/Cargo.toml" \
      -p nodeipam-crd -p nodeipam-alloc -p nodeipam-controller -p nodeipam-webhook -p nodeipam-testenv -p nodeipam-bench
  fi
  echo "$NODEIPAM_ROOT" > "$last"
  export NODEIPAM_TARGET_CLAIMED="$NODEIPAM_ROOT"
}

# ensure_libfaketime: Debian's libfaketime, which the soak (tests/tests/chaos) preloads into
# each replica to step its wall clock; installed with apt-get when missing (as root).
ensure_libfaketime() {
  local lib
  lib="/usr/lib/$(uname -m)-linux-gnu/faketime/libfaketimeMT.so.1"
  [[ -f "$lib" ]] && return 0
  command -v apt-get >/dev/null || die "step=libfaketime: $lib is missing and there is no apt-get"
  [[ $EUID -eq 0 ]] || die "step=libfaketime: $lib is missing; run 'apt-get install libfaketime' as root"
  timed "apt-get install libfaketime" env DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends libfaketime >/dev/null'
}
