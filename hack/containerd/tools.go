//go:build tools

// Package tools pins the containerd commands each test node runs. containerd 2.x, not
// Debian's 1.6: the kubelet needs the CRI RuntimeConfig call, which 1.6 lacks.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
