//go:build tools

// Package tools pins KWOK, which plays the kubelets of the fake nodes in the kubelet-like fleet
// benchmark (hack/bench/fleet.sh). Its own module: KWOK pins its own client-go, apart from
// hack/k8s's.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
