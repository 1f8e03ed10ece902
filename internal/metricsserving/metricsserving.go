// Package metricsserving is how the operator and the agent serve /metrics: over HTTPS, to
// callers whose bearer token the API server authenticates (TokenReview) and authorises for
// GET /metrics (SubjectAccessReview), as kubebuilder-scaffolded operators do. A cluster's
// Prometheus gets in by binding its service account to the trellis-metrics-reader
// ClusterRole (config/prometheus).
package metricsserving

import (
	"crypto/tls"
	"flag"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
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
}

// AddFlags registers the options as flags; addrFlag keeps each binary's historic name.
func (o *Options) AddFlags(fs *flag.FlagSet, addrFlag string) {
	fs.StringVar(&o.Addr, addrFlag, o.Addr, "address /metrics is served on; 0 disables it")
	fs.BoolVar(&o.Secure, "metrics-secure", o.Secure, "serve /metrics over HTTPS to callers the API server authenticates and authorises for GET /metrics; false: plain HTTP to anyone (bind to loopback then)")
	fs.StringVar(&o.CertDir, "metrics-cert-dir", o.CertDir, "directory with tls.crt and tls.key for /metrics (default: a self-signed certificate)")
}

// Server is the controller-runtime metrics server configuration.
func (o Options) Server() metricsserver.Options {
	s := metricsserver.Options{BindAddress: o.Addr, SecureServing: o.Secure}
	if !o.Secure {
		return s
	}
	s.FilterProvider = filters.WithAuthenticationAndAuthorization
	s.CertDir = o.CertDir
	// HTTP/1.1 only: HTTP/2's stream reset and rapid-reset attacks (CVE-2023-44487,
	// CVE-2023-39325) are not worth it for a scrape endpoint.
	s.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	return s
}
