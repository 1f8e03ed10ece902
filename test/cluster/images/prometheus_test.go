package images

import "testing"

// The image is named as upstream tags it: the release, not the module version.
func TestPrometheusImage(t *testing.T) {
	for in, want := range map[string]string{
		"v0.317.1": "quay.io/prometheus/prometheus:v3.17.1",
		"v0.305.2": "quay.io/prometheus/prometheus:v3.5.2",
		"v0.300.0": "quay.io/prometheus/prometheus:v3.0.0",
	} {
		if got, err := PrometheusImage(in); err != nil || got != want {
			t.Errorf("PrometheusImage(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"v3.16.0", "v0.56.0", "v0.316"} {
		if got, err := PrometheusImage(bad); err == nil {
			t.Errorf("PrometheusImage(%q) = %q, want an error", bad, got)
		}
	}
}
