//go:build tools

// Multus, the meta-plugin every node's CNI config names: the thin plugin
// (cmd/multus) and the thick one (daemon + shim), from the published module.
package tools

import (
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim"
)
