//go:build tools

// promtool for the alert and recording rules' checks and unit tests
// (charts/sticky-macvlan/tests), from Prometheus' published module.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
