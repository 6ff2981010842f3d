//go:build tools

// Package tools pins the commands built from this module: the control plane's
// (hack/control-plane.sh) and the nodes' of the local cluster (hack/cluster.sh).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/pkg/controller/nodeipam/ipam/cidrset"
)
