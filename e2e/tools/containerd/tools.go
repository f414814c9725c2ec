//go:build tools

// The cluster's container runtime, built from its published module: Kubernetes
// 1.36's kubelet wants containerd 2.x, and Debian ships 1.6.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
