//go:build tools

// helm for the chart's checks and the local cluster's install test
// (scripts/cluster.sh build), from its published module.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
