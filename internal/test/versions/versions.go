// Package versions reads hack/versions.env, the one place that names the versions of what
// the tests build and run against (Kubernetes, etcd, crictl, the reference CNI plugins, OLM, opm, kwok, Prometheus), so
// that Go test code finds the same cached binaries the hack/ scripts build. As in the
// scripts and the Makefile, a variable set in the environment wins over the file.
package versions

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
)

// File is the path of versions.env relative to the repository root.
const File = "hack/versions.env"

// Set holds the versions of the tools the tests use.
type Set struct {
	// Kubernetes is the release of every Kubernetes binary and of agnhost (K8S_VERSION).
	Kubernetes string
	// Etcd is the etcd release of the control plane (ETCD_VERSION).
	Etcd string
	// CRITools is the sigs.k8s.io/cri-tools release crictl is built from (CRI_TOOLS_VERSION).
	CRITools string
	// CNIPlugins is the github.com/containernetworking/plugins release of the reference
	// plugins (CNI_PLUGINS_VERSION).
	CNIPlugins string
	// OLM is the operator-lifecycle-manager (OLM v0) release (OLM_VERSION).
	OLM string
	// OPM is the operator-registry release opm is built from (OPM_VERSION).
	OPM string
	// Kwok is the sigs.k8s.io/kwok release whose controller simulates nodes (KWOK_VERSION).
	Kwok string
	// Prometheus is the github.com/prometheus/prometheus module version the monitoring
	// e2e's Prometheus server is built from (PROMETHEUS_VERSION; v0.3xx.y is release 3.xx.y).
	Prometheus string
	// Trellis is Trellis's own version (TRELLIS_VERSION): what the binaries the tests
	// build report and the tag of the image config/manager pins.
	Trellis string
}

// The directories the hack/ scripts fill under the cache directory (testenv.CacheDir) for
// these versions.

// KubernetesDir holds etcd and the Kubernetes binaries (hack/build-k8s.sh).
func (s Set) KubernetesDir(cache string) string {
	return filepath.Join(cache, "k8s", s.Kubernetes)
}

// AgnhostDir holds agnhost and its VERSION (hack/build-agnhost.sh).
func (s Set) AgnhostDir(cache string) string {
	return filepath.Join(cache, "agnhost", s.Kubernetes)
}

// RuntimeToolsDir holds crictl and the reference CNI plugins (hack/build-runtime-tools.sh).
func (s Set) RuntimeToolsDir(cache string) string {
	return filepath.Join(cache, "tools", "cri-tools-"+s.CRITools+"_cni-plugins-"+s.CNIPlugins)
}

// OLMDir holds OLM's olm, catalog, package-server, copy-content and cpb (hack/build-olm.sh).
func (s Set) OLMDir(cache string) string {
	return filepath.Join(cache, "tools", "olm-"+s.OLM)
}

// OPMDir holds opm (hack/build-olm.sh).
func (s Set) OPMDir(cache string) string {
	return filepath.Join(cache, "tools", "opm-"+s.OPM)
}

// KwokDir holds kwok's controller (hack/build-kwok.sh).
func (s Set) KwokDir(cache string) string {
	return filepath.Join(cache, "tools", "kwok-"+s.Kwok)
}

// PrometheusDir holds the Prometheus server (hack/build-prometheus.sh).
func (s Set) PrometheusDir(cache string) string {
	return filepath.Join(cache, "tools", "prometheus-"+s.Prometheus)
}

// Load reads the repository's hack/versions.env, with the environment's values winning.
func Load() (Set, error) {
	path, err := path()
	if err != nil {
		return Set{}, err
	}
	f, err := os.Open(path)
	if err != nil {
		return Set{}, fmt.Errorf("reading the tool versions: %w", err)
	}
	defer f.Close()
	vars, err := Parse(f)
	if err != nil {
		return Set{}, fmt.Errorf("%s: %w", path, err)
	}
	s, err := fromVars(vars, os.Getenv)
	if err != nil {
		return Set{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// fromVars picks the versions out of the file's variables; getenv's non-empty values win.
func fromVars(vars map[string]string, getenv func(string) string) (Set, error) {
	var s Set
	for key, dst := range map[string]*string{
		"K8S_VERSION":         &s.Kubernetes,
		"ETCD_VERSION":        &s.Etcd,
		"CRI_TOOLS_VERSION":   &s.CRITools,
		"CNI_PLUGINS_VERSION": &s.CNIPlugins,
		"OLM_VERSION":         &s.OLM,
		"OPM_VERSION":         &s.OPM,
		"KWOK_VERSION":        &s.Kwok,
		"PROMETHEUS_VERSION":  &s.Prometheus,
		"TRELLIS_VERSION":     &s.Trellis,
	} {
		v := getenv(key)
		if v == "" {
			v = vars[key]
		}
		if v == "" {
			return Set{}, fmt.Errorf("%s is not set", key)
		}
		*dst = v
	}
	return s, nil
}

var line = regexp.MustCompile(`^([A-Z][A-Z0-9_]*)=([A-Za-z0-9._+-]+)$`)

// Parse reads KEY=value lines; blank lines and # comments are skipped. Anything else is an
// error: the file must stay simple enough for bash, make and this parser to agree on it.
func Parse(r io.Reader) (map[string]string, error) {
	vars := map[string]string{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		m := line.FindStringSubmatch(text)
		if m == nil {
			return nil, fmt.Errorf("line %d: %q is not KEY=value (no spaces, quotes or expansions)", n, text)
		}
		if _, dup := vars[m[1]]; dup {
			return nil, fmt.Errorf("line %d: %s is set twice", n, m[1])
		}
		vars[m[1]] = m[2]
	}
	return vars, sc.Err()
}

// path finds hack/versions.env: beside this source file's repository (the usual case, go
// test and go run), else in the first parent of the working directory that has one (a
// binary built with -trimpath or moved elsewhere, run inside the repository).
func path() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		p := filepath.Join(filepath.Dir(file), "..", "..", "..", File)
		if _, err := os.Stat(p); err == nil {
			return filepath.Clean(p), nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding %s: %w", File, err)
	}
	for {
		p := filepath.Join(dir, File)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("finding %s: %w", File, err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found: run this inside the Trellis repository", File)
		}
		dir = parent
	}
}
