//go:build tools

// Package tools pins etcdutl, which the end-to-end test of an etcd restored from a snapshot
// (tests/tests/etcd_restore.rs) runs as an operator would, built by hack/etcdutl.sh at the
// version of the etcd in hack/etcd. A module of its own so that the control-plane binaries'
// stamp (hack/control-plane.sh) does not move with it.
package tools

import _ "go.etcd.io/etcd/etcdutl/v3"
