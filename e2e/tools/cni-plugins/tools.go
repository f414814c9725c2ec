//go:build tools

// The reference CNI plugins at a release that knows CNI 1.1.0: the
// cluster's primary network (bridge + host-local + loopback) and the
// side-by-side conformance runs.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/ipam/static"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/main/macvlan"
	_ "github.com/containernetworking/plugins/plugins/meta/tuning"
)
