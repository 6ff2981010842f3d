//go:build tools

// Package tools pins the Helm v3 command that the chart tests (tests/tests/helm.rs) and the
// release workflow use, built by hack/helm.sh. A module of its own so that Helm's
// Kubernetes libraries never move the versions pinned in hack/k8s.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
