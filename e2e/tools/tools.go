//go:build tools

// Package tools pins the command-line tools the e2e tests run.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
