#!/usr/bin/env bash
# Runs every test: builds the pinned control-plane binaries and Helm (cached), then lint and the whole
# cargo test suite, which includes the end-to-end tests against a real kube-apiserver and etcd;
# then the real-cluster suite: kubelets, containerd, kube-proxy and nodeipam from its own image.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$NODEIPAM_ROOT"
claim_target

timed "control-plane binaries" "$NODEIPAM_ROOT/hack/control-plane.sh" build
# Helm v3 for the chart tests (tests/tests/helm.rs); cached and stamped like the above.
timed "helm" "$NODEIPAM_ROOT/hack/helm.sh" build
# etcdutl for restoring etcd from a snapshot (tests/tests/etcd_restore.rs); cached and stamped too.
timed "etcdutl" "$NODEIPAM_ROOT/hack/etcdutl.sh" build
# libfaketime steps a replica's wall clock in the soak (tests/tests/chaos); from Debian.
ensure_libfaketime
timed "cargo fmt --check" cargo fmt --all -- --check
timed "cargo clippy -D warnings" cargo clippy --workspace --all-targets --locked -- -D warnings
# The end-to-end tests run the real `nodeipam` binary as a process (failover, RBAC).
timed "cargo build binaries" cargo build --workspace --locked --bins
timed "cargo build tests" cargo test --workspace --locked --no-run
# The end-to-end tests each start their own control plane; two at a time fits a 2-core machine.
timed "cargo test" cargo test --workspace --locked -- --test-threads="${NODEIPAM_TEST_THREADS:-2}"
# A real cluster (needs root): Debian packages, kubelet, kube-proxy, kube-scheduler, containerd,
# the pause and netprobe images and flanneld (cached and stamped, a no-op when warm), nodeipam's
# image from the Containerfile, then the suite that brings the cluster up (with the bridge CNI,
# then with flannel), deploys config/default and takes it down. It is #[ignore]d in the run above because it needs these builds.
timed "cluster binaries" "$NODEIPAM_ROOT/hack/cluster.sh" build
timed "nodeipam image" "$NODEIPAM_ROOT/hack/image.sh" build
# Every release artifact into a temporary folder (tests/tests/release.rs); its image is the one
# built above (the release tag), which the real-cluster suite below deploys.
timed "cargo test release e2e" cargo test --locked -p nodeipam-testenv --test release -- --ignored --test-threads=1
timed "cargo test cluster e2e" cargo test --locked -p nodeipam-testenv --test cluster -- --ignored --test-threads=1 --nocapture
