// Package metricsserving is how the operator and the agent serve /metrics: over HTTPS, to
// callers whose bearer token, issued for the audience trellis-metrics, the API server
// authenticates (TokenReview, cached and within Limits) and authorises for GET /metrics
// (SubjectAccessReview); the agent also takes client certificates of the cluster's CA. A
// cluster's Prometheus gets in with a projected service-account token of that audience and
// its service account bound to the trellis-metrics-reader ClusterRole (config/prometheus).
package metricsserving

import (
	"crypto/tls"
	"flag"

	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Options say where and how /metrics is served.
type Options struct {
	// Addr is the listen address; "0" turns metrics off.
	Addr string
	// Secure serves HTTPS with authentication and authorisation; off, plain HTTP to anyone
	// who can reach Addr (for a loopback-only address).
	Secure bool
	// CertDir holds tls.crt and tls.key (e.g. from cert-manager); empty: a self-signed
	// certificate made at start.
	CertDir string
	// Limits bound the TokenReviews of a Secure server (zero: DefaultLimits).
	Limits Limits
}

// AddFlags registers the options as flags; addrFlag keeps each binary's historic name.
func (o *Options) AddFlags(fs *flag.FlagSet, addrFlag string) {
	fs.StringVar(&o.Addr, addrFlag, o.Addr, "address /metrics is served on; 0 disables it")
	fs.BoolVar(&o.Secure, "metrics-secure", o.Secure, "serve /metrics over HTTPS to callers the API server authenticates and authorises for GET /metrics; false: plain HTTP to anyone (bind to loopback then)")
	fs.StringVar(&o.CertDir, "metrics-cert-dir", o.CertDir, "directory with tls.crt and tls.key for /metrics (default: a self-signed certificate)")
}

// server is the controller-runtime metrics server configuration, without authentication
// (delegated adds it when Secure).
func (o Options) server() metricsserver.Options {
	s := metricsserver.Options{BindAddress: o.Addr, SecureServing: o.Secure}
	if !o.Secure {
		return s
	}
	s.CertDir = o.CertDir
	// HTTP/1.1 only: HTTP/2's stream reset and rapid-reset attacks (CVE-2023-44487,
	// CVE-2023-39325) are not worth it for a scrape endpoint.
	s.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	return s
}
