//go:build tools

// Package tools pins flanneld, the pod network the local cluster runs with `--cni flannel`
// (hack/cluster.sh). Its own module: flannel pins its own client-go, apart from hack/k8s's.
package tools

import (
	_ "github.com/flannel-io/flannel"
)
