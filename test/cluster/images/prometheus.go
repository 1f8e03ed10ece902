package images

import (
	"fmt"
	"path/filepath"
	"regexp"
)

// PrometheusUser is the unprivileged user Prometheus runs as (upstream's image's nobody).
const PrometheusUser = "65534:65534"

// prometheusModuleVersion is how github.com/prometheus/prometheus versions its module:
// v0.3xx.y for release 3.xx.y (Go modules above v1 would need a /v3 path).
var prometheusModuleVersion = regexp.MustCompile(`^v0\.3(\d\d)\.(\d+)$`)

// PrometheusImage is the name of the Prometheus server's image for the module version
// (PROMETHEUS_VERSION of hack/versions.env): upstream's name with the release's tag, so
// v0.316.0 is quay.io/prometheus/prometheus:v3.16.0.
func PrometheusImage(moduleVersion string) (string, error) {
	m := prometheusModuleVersion.FindStringSubmatch(moduleVersion)
	if m == nil {
		return "", fmt.Errorf("prometheus module version %q is not v0.3MM.P (release 3.MM.P)", moduleVersion)
	}
	minor := m[1]
	if minor[0] == '0' {
		minor = minor[1:]
	}
	return fmt.Sprintf("quay.io/prometheus/prometheus:v3.%s.%s", minor, m[2]), nil
}

// PrometheusArchive returns an archive holding PrometheusImage(moduleVersion): the static
// prometheus that hack/build-prometheus.sh built into binDir at /bin/prometheus, as
// upstream's image has it, running as PrometheusUser; the configuration and the storage
// come from the pod's volumes. Cached under cacheDir/prometheus by content.
func PrometheusArchive(cacheDir, binDir, moduleVersion string) (string, bool, error) {
	name, err := PrometheusImage(moduleVersion)
	if err != nil {
		return "", false, err
	}
	return Archive(filepath.Join(cacheDir, "prometheus"), []Spec{{
		Name:       name,
		Layers:     []Layer{{Files: []File{{Path: "/bin/prometheus", Source: filepath.Join(binDir, "prometheus")}}}},
		Entrypoint: []string{"/bin/prometheus"},
		User:       PrometheusUser,
	}})
}
