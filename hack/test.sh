#!/usr/bin/env bash
# Runs every test: builds the pinned control-plane binaries (cached), then lint and the whole
# cargo test suite, which includes the end-to-end tests against a real kube-apiserver and etcd.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$NODEIPAM_ROOT"
claim_target

timed "control-plane binaries" "$NODEIPAM_ROOT/hack/control-plane.sh" build
timed "cargo fmt --check" cargo fmt --all -- --check
timed "cargo clippy -D warnings" cargo clippy --workspace --all-targets --locked -- -D warnings
# The end-to-end tests run the real `nodeipam` binary as a process (failover, RBAC).
timed "cargo build binaries" cargo build --workspace --locked --bins
timed "cargo build tests" cargo test --workspace --locked --no-run
# The end-to-end tests each start their own control plane; two at a time fits a 2-core machine.
timed "cargo test" cargo test --workspace --locked -- --test-threads="${NODEIPAM_TEST_THREADS:-2}"
