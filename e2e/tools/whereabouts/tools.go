//go:build tools

// Whereabouts, the cluster-wide IPAM most Multus users pick, run beside
// sticky-macvlan on the same cluster and fabric for the side-by-side
// StatefulSet scenarios.
package tools

import (
	_ "github.com/k8snetworkplumbingwg/whereabouts/cmd"
)
