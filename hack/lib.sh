# shellcheck shell=bash
# Shared paths and helpers for the hack/ scripts. Source it; do not run it.

NODEIPAM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Builds live outside git so that a fresh clone (CI) on the same machine reuses them.
NODEIPAM_CACHE="${NODEIPAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeipam}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$NODEIPAM_CACHE/target}"

K8S_VERSION="v1.37.2"
ETCD_VERSION="v3.6.16"
NODEIPAM_BIN_DIR="$NODEIPAM_CACHE/bin"
# The harness finds the binaries here (see tests/harness).
export NODEIPAM_ASSETS="${NODEIPAM_ASSETS:-$NODEIPAM_BIN_DIR/k8s-$K8S_VERSION-etcd-$ETCD_VERSION}"

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
